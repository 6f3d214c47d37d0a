"""TRL 1.16.0's GRPO reward arithmetic, transcribed line by line for rlvr's tests to compare with: trainer/utils.py
(nanstd) and trainer/grpo_trainer.py (GRPOTrainer._generate_and_score_completions: the advantages, from
`unscorable_mask` to `nan_to_num`, the reward statistics it logs, and vLLM's importance-sampling ratio with its
statistics). Variable names are TRL's. Also rewards to
compare them on (`rewards_with_gaps`)."""

from __future__ import annotations

import math

import torch


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


def trl_reward_metrics(rewards_per_func, reward_weights, names):
    out = {}
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    for i, reward_func_name in enumerate(names):
        out[f"rewards/{reward_func_name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
        out[f"rewards/{reward_func_name}/std"] = trl_nanstd(rewards_per_func[:, i]).item()
    rewards = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    out["reward"] = torch.nanmean(rewards).item()
    out["reward_std"] = trl_nanstd(rewards).item()
    return out


def trl_importance_sampling(old_per_token_logps, sampling_per_token_logps, mask, mode, clip_min, clip_max):
    """The ratio multiplying the per-token loss ([B, T] or, sequence modes, [B, 1]) and its logged min / mean / max."""
    per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask
    per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)
    sequence_level_is = mode in ["sequence_mask", "sequence_truncate"]
    if sequence_level_is:
        per_sequence_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
        logps_diff = per_sequence_logps_diff
    else:
        logps_diff = per_token_logps_diff
    vllm_importance_sampling_ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        vllm_importance_sampling_ratio = torch.clamp(vllm_importance_sampling_ratio, min=clip_min, max=clip_max)
    elif mode in ["sequence_mask", "token_mask"]:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf
        invalid_mis_mask = (vllm_importance_sampling_ratio < min_val) | (vllm_importance_sampling_ratio > max_val)
        vllm_importance_sampling_ratio = vllm_importance_sampling_ratio.masked_fill(invalid_mis_mask, value=0.0)
    if sequence_level_is:
        flat_is_ratio = vllm_importance_sampling_ratio.flatten()
    else:
        flat_is_ratio = vllm_importance_sampling_ratio[mask.bool()]
    stats = (torch.min(flat_is_ratio), torch.mean(flat_is_ratio), torch.max(flat_is_ratio))
    return vllm_importance_sampling_ratio, stats
