"""rlvr's advantages against TRL's, transcribed line by line from trl 1.16.0 trainer/grpo_trainer.py
(GRPOTrainer._generate_and_score_completions, from `unscorable_mask` to `nan_to_num`) and trainer/utils.py (nanstd).

A GRPOConfig becomes algo.std_ddof=1 and algo.std_eps=1e-4 (rlvr.api.trl_mapping), and normalize_then_sum
becomes scale_rewards=group whatever the GRPOConfig says (TRL divides by the stds there in any case); with those,
rlvr.algo.combine_rewards must give TRL's advantages for every aggregation and scale, including rewards of None
(NaN) from some functions, completions no function scored, groups of equal rewards and groups with a single
scored completion."""

from __future__ import annotations

import pytest
import torch

from rlvr.algo import combine_rewards


def trl_nanstd(tensor, dim=None, keepdim=False):
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    variance *= correction
    if not keepdim:
        variance = variance.squeeze(dim) if dim is not None else variance.squeeze()
    return torch.sqrt(variance)


def trl_advantages(rewards_per_func, reward_weights, num_generations, multi_objective_aggregation, scale_rewards):
    nanstd = trl_nanstd
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    if multi_objective_aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
        mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
        if scale_rewards in ["group", "none"]:
            if num_generations > 1:
                std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
                std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
            else:
                std_rewards = torch.zeros_like(rewards)
        elif scale_rewards == "batch":
            if rewards.numel() > 1:
                std_rewards = nanstd(rewards).expand_as(rewards)
            else:
                std_rewards = torch.zeros_like(rewards)
        advantages = rewards - mean_grouped_rewards
        if scale_rewards != "none":
            advantages = advantages / (std_rewards + 1e-4)
    elif multi_objective_aggregation == "normalize_then_sum":
        grouped = rewards_per_func.view(-1, num_generations, len(reward_weights))
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
        reward_k = (grouped - mean_k) / (std_k + 1e-4)
        reward_k = reward_k.view(-1, len(reward_weights))
        rewards = (reward_k * reward_weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        std_rewards = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def rewards_with_gaps(seed: int, groups: int, G: int, K: int) -> torch.Tensor:
    """[groups x G, K] float64 rewards: some NaN (a function returning None), one completion no function scored,
    one group of equal rewards, one group with a single scored completion."""
    g = torch.Generator().manual_seed(seed)
    r = torch.rand(groups * G, K, generator=g, dtype=torch.float64).mul(3).round().div(2)  # ties, as graders make
    r[torch.rand(groups * G, K, generator=g) < 0.2] = float("nan")
    r[1] = float("nan")  # unscorable
    r[G : 2 * G] = 0.5  # no signal
    r[2 * G + 1 : 3 * G] = float("nan")  # one scored completion in the group
    return r


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
