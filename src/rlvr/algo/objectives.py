"""Per-token objectives: the clipped surrogate at each importance-ratio level.

Per token t of completion i, with log-ratio l_it and ratio r_it = exp(l_it):

    loss_it = -min(r'_it * A_i, clip(r_it, 1 - epsilon, 1 + epsilon_high) * A_i)
    r'_it   = min(r_it, delta) when delta is given, else r_it   (TRL's two-sided clipping)

The objectives differ only in the log-ratio:

    token     l_it = log p_new(y_it) - log p_old(y_it)                  one ratio per token (PPO, GRPO)
    sequence  l_it = l_i = (1 / n_i) sum_t m_it (log p_new - log p_old)  one ratio per completion (GSPO)

An entry of OBJECTIVES maps (logp [N, L], old_logp [N, L], advantages [N], mask [N, L]) to
(per-token loss [N, L], ratio [N, L] or [N, 1]) and declares:

    zero_gradient_at_zero_advantage  a completion with A_i = 0 has loss -min(r' * 0, clip(r) * 0) = 0
                                     and gradient exactly 0 on every token, whatever r is, at every pass.

Adding an objective: one function, one entry below, one test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Objective:
    """A per-token policy objective and the properties the trainer's fast paths rely on."""

    # fn(logp [N, L], old_logp [N, L], advantages [N], mask [N, L], *, epsilon, epsilon_high, delta)
    #   -> (per-token loss [N, L], ratio broadcastable to [N, L])
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    zero_gradient_at_zero_advantage: bool


# --- log-ratios: (logp [N, L], old_logp [N, L], mask [N, L]) -> broadcastable to [N, L] ------


def token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """l_it = log p_new(y_it) - log p_old(y_it): one ratio per token."""
    return logp - old_logp  # [N, L]


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO: l_i = mean of the per-token log-ratios over completion i's tokens (exp: the geometric mean ratio)."""
    per_seq = ((logp - old_logp) * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [N]
    return per_seq.unsqueeze(-1)  # [N, 1], the same ratio for every token


# --- the shared clipped surrogate --------------------------------------------------------------


def clipped_surrogate(
    log_ratio: torch.Tensor,  # [N, L] or [N, 1]
    advantages: torch.Tensor,  # [N]
    like: torch.Tensor,  # [N, L] the shape the per-token loss takes
    *,
    epsilon: float,
    epsilon_high: float | None,
    delta: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-min(r' A, clip(r, 1 - epsilon, 1 + epsilon_high) A) with r = exp(log_ratio), r' = min(r, delta).

    Returns (per-token loss [N, L], ratio shaped as log_ratio). epsilon_high=None: symmetric clip."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.unsqueeze(-1)  # [N, 1]
    ratio = torch.exp(log_ratio)  # [N, L] or [N, 1]
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high)  # like ratio
    capped = ratio if delta is None else torch.clamp(ratio, max=delta)  # like ratio
    per_token = -torch.min(capped * adv, clipped * adv)  # like ratio
    return per_token.expand_as(like), ratio  # [N, L], like log_ratio


# --- the objectives ----------------------------------------------------------------------------


def token_objective(
    logp: torch.Tensor,  # [N, L]
    old_logp: torch.Tensor,  # [N, L]
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, L]
    *,
    epsilon: float,
    epsilon_high: float | None,
    delta: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([N, L], [N, L])
    """PPO / GRPO: loss_it = -min(r'_it A_i, clip(r_it, 1 - eps, 1 + eps_high) A_i), r_it = p_new(y_it) / p_old(y_it)."""
    return clipped_surrogate(token_log_ratio(logp, old_logp, mask), advantages, logp,
                             epsilon=epsilon, epsilon_high=epsilon_high, delta=delta)


def sequence_objective(
    logp: torch.Tensor,  # [N, L]
    old_logp: torch.Tensor,  # [N, L]
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, L]
    *,
    epsilon: float,
    epsilon_high: float | None,
    delta: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([N, L], [N, 1])
    """GSPO: loss_it = -min(r'_i A_i, clip(r_i, 1 - eps, 1 + eps_high) A_i) on every token of completion i,
    with r_i = exp((1 / n_i) sum_t m_it (log p_new(y_it) - log p_old(y_it))): a whole completion clips at once."""
    return clipped_surrogate(sequence_log_ratio(logp, old_logp, mask), advantages, logp,
                             epsilon=epsilon, epsilon_high=epsilon_high, delta=delta)


# Keyed by the values of `algo.importance_sampling_level`.
OBJECTIVES: dict[str, Objective] = {
    "token": Objective(token_objective, zero_gradient_at_zero_advantage=True),
    "sequence": Objective(sequence_objective, zero_gradient_at_zero_advantage=True),
}

# The log-ratio of each importance level (the objectives' only difference), by the same names.
IMPORTANCE_LEVELS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": token_log_ratio,
    "sequence": sequence_log_ratio,
}
