"""rlvr's advantages against TRL 1.16's (tests/_trl_grpo.py transcribes its code).

A GRPOConfig becomes algo.std_ddof=1 and algo.std_eps=1e-4 (rlvr.api.trl_mapping), and normalize_then_sum
becomes scale_rewards=group whatever the GRPOConfig says (TRL divides by the stds there in any case); with those,
rlvr.algo.combine_rewards must give TRL's advantages for every aggregation and scale, including rewards of None
(NaN) from some functions, completions no function scored, groups of equal rewards and groups with a single
scored completion."""

from __future__ import annotations

import pytest
import torch

from _trl_grpo import rewards_with_gaps, trl_advantages
from rlvr.algo import combine_rewards


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize(
    "mode, trl_scale, scale",
    [
        ("sum_then_normalize", "group", "group"),
        ("sum_then_normalize", "batch", "batch"),
        ("sum_then_normalize", "none", "none"),
        ("normalize_then_sum", "group", "group"),
        ("normalize_then_sum", "none", "group"),  # TRL ignores scale_rewards there; the mapping says group
    ],
)
def test_advantages_are_trls(seed, K, mode, trl_scale, scale):
    G, groups = 4, 5
    rewards = rewards_with_gaps(seed, groups, G, K)
    weights = torch.tensor([1.0, 0.5, -2.0][:K], dtype=torch.float64)
    ours = combine_rewards(rewards, weights, G, mode=mode, scale=scale, ddof=1, eps=1e-4)
    theirs = trl_advantages(rewards.clone(), weights, G, mode, trl_scale)
    # TRL's nanstd forms count / (count - 1) from integer counts in float32 (4/3 off by 2.5e-8 relative): the rest is exact
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=1e-12)
    assert ours[1] == 0.0  # the unscorable completion


def test_the_population_std_and_1e8_differ_from_trls():
    """The seeds' defaults (ddof 0, eps 1e-8) are not TRL's: the mapping's settings matter."""
    rewards = torch.tensor([[0.8], [0.3], [0.6], [0.3]], dtype=torch.float64)
    ours = combine_rewards(rewards, torch.ones(1, dtype=torch.float64), 4)
    theirs = trl_advantages(rewards.clone(), torch.ones(1, dtype=torch.float64), 4, "sum_then_normalize", "group")
    assert ours[0] == pytest.approx(1.41, abs=0.01) and theirs[0] == pytest.approx(1.22, abs=0.01)


def test_grpo_config_maps_to_trls_std():
    from rlvr import GRPOConfig
    from rlvr.api.trl_mapping import settings

    for aggregation, scale, want in [("sum_then_normalize", False, "none"), ("normalize_then_sum", False, "group")]:
        args = GRPOConfig(output_dir="x", multi_objective_aggregation=aggregation, scale_rewards=scale)
        fields, _ = settings(args, world_size=1, rows=8, has_eval=False, has_tools=False)
        assert (fields["algo.std_ddof"], fields["algo.std_eps"], fields["algo.scale_rewards"]) == (1, 1e-4, want)
