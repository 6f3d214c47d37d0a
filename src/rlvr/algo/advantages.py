"""Group-relative advantages: A_i = (r_i - mean(group)) / (scale + eps).

Rewards arrive prompt-major: the G completions of prompt 0, then prompt 1, and so on.
A reward of NaN means "not applicable" (a reward function returned None for that sample).
"""

from __future__ import annotations

from typing import Callable

import torch


def _nan_std(x: torch.Tensor, ddof: int) -> torch.Tensor:  # [R, C] -> [R, 1]
    """Standard deviation of each row ignoring NaNs, with `ddof` degrees of freedom (0: population)."""
    n = (~x.isnan()).sum(dim=-1, keepdim=True)
    mean = x.nanmean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).nansum(dim=-1, keepdim=True) / (n - ddof).clamp(min=1)
    return var.sqrt()


def _scale_group(grouped: torch.Tensor, ddof: int) -> torch.Tensor:  # [B, G] -> [B, 1]
    return _nan_std(grouped, ddof)


def _scale_batch(grouped: torch.Tensor, ddof: int) -> torch.Tensor:  # [B, G] -> [1, 1]
    return _nan_std(grouped.reshape(1, -1), ddof)


def _scale_none(grouped: torch.Tensor, ddof: int) -> torch.Tensor:  # [B, G] -> [1, 1]
    return torch.ones((1, 1), dtype=grouped.dtype, device=grouped.device)


# Each maps grouped rewards [B, G] to the divisor of the centred rewards (broadcastable).
ADVANTAGE_SCALES: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "group": _scale_group,  # DeepSeekMath / the seeds: each group's own std
    "batch": _scale_batch,  # std over the whole batch (Understanding R1-Zero, "batch" in TRL)
    "none": _scale_none,  # Dr. GRPO: centre only
}


def group_advantages(
    rewards: torch.Tensor,  # [B x G]
    group_size: int,
    *,
    scale: str = "group",
    ddof: int = 0,
    eps: float = 1e-8,
) -> torch.Tensor:  # [B x G]
    """Centre each reward on its group's mean and divide by the chosen scale.

    With the defaults the seeds' table holds: [0.8, 0.3, 0.6, 0.3] -> [1.41, -0.94, 0.47, -0.94].
    A group whose rewards are all equal gets 0 everywhere (0 / (0 + eps)). NaN rewards are
    left out of their group's statistics and get advantage 0. With scale="none", eps is not
    added (the divisor is exactly 1).
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {sorted(ADVANTAGE_SCALES)}, got {scale!r}")
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, got {tuple(rewards.shape)}")
    grouped = rewards.reshape(-1, group_size)  # [B, G]
    centred = grouped - grouped.nanmean(dim=-1, keepdim=True)
    divisor = ADVANTAGE_SCALES[scale](grouped, ddof)
    if scale != "none":
        divisor = divisor + eps
    return torch.nan_to_num(centred / divisor, nan=0.0).reshape(-1)


def _sum_then_normalize(rewards, weights, group_size, **kw):  # rewards [B x G, K], weights [K]
    total = (rewards * weights).nansum(dim=-1)  # a None from one function does not erase the others
    all_nan = rewards.isnan().all(dim=-1)
    total = total.masked_fill(all_nan, float("nan"))
    return group_advantages(total, group_size, **kw)


def _normalize_then_sum(rewards, weights, group_size, **kw):  # rewards [B x G, K], weights [K]
    per_fn = torch.stack([group_advantages(rewards[:, k], group_size, **kw) for k in range(rewards.shape[1])], dim=-1)
    return (per_fn * weights).sum(dim=-1)


REWARD_AGGREGATIONS = {
    "sum_then_normalize": _sum_then_normalize,  # weighted sum of rewards, then group-normalise
    "normalize_then_sum": _normalize_then_sum,  # group-normalise each reward, then weighted sum (GDPO)
}


def combine_rewards(
    rewards: torch.Tensor,  # [B x G, K] one column per reward function, NaN = not applicable
    weights: torch.Tensor,  # [K]
    group_size: int,
    *,
    mode: str = "sum_then_normalize",
    scale: str = "group",
    ddof: int = 0,
    eps: float = 1e-8,
) -> torch.Tensor:  # [B x G] advantages
    if mode not in REWARD_AGGREGATIONS:
        raise ValueError(f"mode must be one of {sorted(REWARD_AGGREGATIONS)}, got {mode!r}")
    return REWARD_AGGREGATIONS[mode](rewards, weights.to(rewards), group_size, scale=scale, ddof=ddof, eps=eps)
