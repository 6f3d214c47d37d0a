"""The step's reward statistics against TRL 1.16's (GRPOTrainer._generate_and_score_completions, after the
advantages): `reward` and `reward_std` over the completions some function scored, the std Bessel-corrected over
the whole batch; `rewards/<fn>/mean` and `/std` over the completions each function scored. TRL's code is
transcribed in tests/_trl_grpo.py."""

from __future__ import annotations

import pytest
import torch

from _trl_grpo import rewards_with_gaps, trl_reward_metrics
from rlvr.training.step_metrics import reward_metrics


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("K", [1, 3])
def test_reward_statistics_are_trls(seed, K):
    rewards = rewards_with_gaps(seed, groups=5, G=4, K=K)
    weights = torch.tensor([1.0, 0.5, -2.0][:K], dtype=torch.float64)
    names = ["a", "b", "c"][:K]
    ours = reward_metrics(rewards, weights, names, group_size=4)
    theirs = trl_reward_metrics(rewards.clone(), weights, names)
    for key, value in theirs.items():  # TRL's nanstd rounds its count correction in float32 (4/3: 2.5e-8)
        assert ours[key] == pytest.approx(value, rel=1e-7, abs=1e-12), key


def test_a_batch_nothing_scored_has_no_reward_and_one_completion_no_spread():
    nothing = torch.full((4, 2), float("nan"), dtype=torch.float64)
    m = reward_metrics(nothing, torch.ones(2, dtype=torch.float64), ["a", "b"], group_size=4)
    assert torch.isnan(torch.tensor(m["reward"])) and torch.isnan(torch.tensor(m["rewards/a/mean"]))
    one = nothing.clone()
    one[2, 0] = 0.75
    m = reward_metrics(one, torch.ones(2, dtype=torch.float64), ["a", "b"], group_size=4)
    assert (m["reward"], m["reward_std"], m["rewards/a/mean"], m["rewards/a/std"]) == (0.75, 0.0, 0.75, 0.0)
