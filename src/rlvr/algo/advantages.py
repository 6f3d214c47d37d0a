"""Group-relative advantages: A_i = (r_i - mean(group)) / (scale + eps).

Rewards arrive prompt-major: the G completions of prompt 0, then prompt 1, and so on.
A reward of NaN means "not applicable" (a reward function returned None for that sample).
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch


def _nan_std(x: torch.Tensor, ddof: int) -> torch.Tensor:  # [R, C] -> [R, 1]
    """Standard deviation of each row ignoring NaNs, with `ddof` degrees of freedom (0: population)."""
    n = (~x.isnan()).sum(dim=-1, keepdim=True)
    mean = x.nanmean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).nansum(dim=-1, keepdim=True) / (n - ddof).clamp(min=1)
    return var.sqrt()


def _group_spread(grouped: torch.Tensor) -> torch.Tensor:  # [B, G] -> [B]
    """max - min of each group over its non-NaN entries; 0 when fewer than two are valid."""
    valid = ~grouped.isnan()
    hi = grouped.masked_fill(~valid, float("-inf")).max(dim=-1).values
    lo = grouped.masked_fill(~valid, float("inf")).min(dim=-1).values
    return torch.where(valid.sum(-1) >= 2, hi - lo, torch.zeros_like(hi))


def _scale_group(grouped: torch.Tensor, ddof: int) -> torch.Tensor:  # [B, G] -> [B, 1]
    """Each group's own std (DeepSeekMath, the seeds): A = (r - mean_g) / (std_g + eps)."""
    return _nan_std(grouped, ddof)


def _scale_batch(grouped: torch.Tensor, ddof: int) -> torch.Tensor:  # [B, G] -> [1, 1]
    """The std of the whole batch (Understanding R1-Zero, TRL's "batch"): A = (r - mean_g) / (std_batch + eps)."""
    return _nan_std(grouped.reshape(1, -1), ddof)


def _scale_none(grouped: torch.Tensor, ddof: int) -> torch.Tensor:  # [B, G] -> [1, 1]
    """No scaling (Dr. GRPO): A = r - mean_g."""
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
    # Equal rewards centre to exactly 0, not to the mean's rounding error (0.1 * 3 / 3 != 0.1),
    # which divided by std + eps would give advantages of 1e-9 instead of 0.
    centred = centred.masked_fill((_group_spread(grouped) == 0).unsqueeze(-1), 0.0)
    divisor = ADVANTAGE_SCALES[scale](grouped, ddof)
    if scale != "none":
        divisor = divisor + eps
    return torch.nan_to_num(centred / divisor, nan=0.0).reshape(-1)


def _sum_then_normalize(
    rewards: torch.Tensor,  # [B x G, K]
    weights: torch.Tensor,  # [K]
    group_size: int,
    *,
    scale: str = "group",
    ddof: int = 0,
    eps: float = 1e-8,
) -> torch.Tensor:  # [B x G]
    """The weighted sum of the rewards (NaN = not applicable, skipped), then group advantages of the sum."""
    total = (rewards * weights).nansum(dim=-1)  # [B x G] a None from one function does not erase the others
    all_nan = rewards.isnan().all(dim=-1)
    total = total.masked_fill(all_nan, float("nan"))
    return group_advantages(total, group_size, scale=scale, ddof=ddof, eps=eps)


def _normalize_then_sum(
    rewards: torch.Tensor,  # [B x G, K]
    weights: torch.Tensor,  # [K]
    group_size: int,
    *,
    scale: str = "group",
    ddof: int = 0,
    eps: float = 1e-8,
) -> torch.Tensor:  # [B x G]
    """GDPO: each reward normalised in its own group, the weighted sum of those advantages, then
    batch-wise normalisation of the sum (its std over the whole batch) so that the advantage's
    range does not grow with the number of reward functions. With scale="none" only centring
    is done at either stage (Dr. GRPO's choice carried over). A completion no function scored
    (all NaN) is left out of the batch's mean and std, as out of its group's, and gets 0 (TRL)."""
    per_fn = torch.stack(
        [group_advantages(rewards[:, k], group_size, scale=scale, ddof=ddof, eps=eps) for k in range(rewards.shape[1])],
        dim=-1,
    )  # [B x G, K] 0 where a function did not score
    total = (per_fn * weights).sum(dim=-1).masked_fill(rewards.isnan().all(dim=-1), float("nan"))  # [B x G]
    if scale == "none":
        return total.nan_to_num(0.0)
    centred = total - total.nanmean()  # already ~0: every group-normalised column has group mean 0
    return (centred / (_nan_std(total.reshape(1, -1), ddof).reshape(()) + eps)).nan_to_num(0.0)


class RewardAggregation(Protocol):
    """Maps per-function rewards [B x G, K] (NaN = not applicable) and weights [K] to advantages [B x G]."""

    def __call__(
        self, rewards: torch.Tensor, weights: torch.Tensor, group_size: int, *, scale: str, ddof: int, eps: float
    ) -> torch.Tensor: ...


REWARD_AGGREGATIONS: dict[str, RewardAggregation] = {
    "sum_then_normalize": _sum_then_normalize,  # weighted sum of rewards, then group-normalise (default)
    "normalize_then_sum": _normalize_then_sum,  # group-normalise each reward, weighted sum, batch-normalise (GDPO)
}


def _signal_sum_then_normalize(
    rewards: torch.Tensor, weights: torch.Tensor, group_size: int, tol: float
) -> torch.Tensor:  # [B x G, K], [K] -> [B]
    """The group's weighted reward sums differ (spread > tol)."""
    total = (rewards * weights).nansum(dim=-1).masked_fill(rewards.isnan().all(dim=-1), float("nan"))
    return _group_spread(total.reshape(-1, group_size)) > tol


def _signal_normalize_then_sum(
    rewards: torch.Tensor, weights: torch.Tensor, group_size: int, tol: float
) -> torch.Tensor:  # [B x G, K], [K] -> [B]
    """Some reward with a non-zero weight differs within the group (spread > tol)."""
    spreads = torch.stack([_group_spread(rewards[:, k].reshape(-1, group_size)) for k in range(rewards.shape[1])], dim=-1)
    return ((spreads > tol) & (weights != 0)).any(dim=-1)


# Whether each group yields a non-zero advantage under each aggregation mode (dynamic sampling).
GROUP_SIGNAL: dict[str, Callable[[torch.Tensor, torch.Tensor, int, float], torch.Tensor]] = {
    "sum_then_normalize": _signal_sum_then_normalize,
    "normalize_then_sum": _signal_normalize_then_sum,
}


def groups_with_signal(
    rewards: torch.Tensor,  # [B x G, K] one column per reward function, NaN = not applicable
    weights: torch.Tensor,  # [K]
    group_size: int,
    *,
    mode: str = "sum_then_normalize",
    tol: float = 1e-12,
) -> torch.Tensor:  # [B] bool
    """True for the groups whose rewards differ (DAPO's dynamic sampling keeps only those).

    sum_then_normalize: the weighted sums differ, exactly when the group's advantages are not all
    zero. normalize_then_sum: some reward with a non-zero weight differs on its own (rewards that
    move in exact opposition with equal weights can still cancel to zero advantages; such a
    group counts as having signal). A group with fewer than two applicable rewards has none."""
    if mode not in GROUP_SIGNAL:
        raise ValueError(f"mode must be one of {sorted(GROUP_SIGNAL)}, got {mode!r}")
    return GROUP_SIGNAL[mode](rewards, weights.to(rewards), group_size, tol)


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
