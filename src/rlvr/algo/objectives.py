"""Per-token policy objectives: what token t of completion i adds to the loss, given its log-ratio
l (per token or per completion, by IMPORTANCE_LEVELS) and the completion's advantage A_i.

With r = exp(l), sg() a stop-gradient, logp_it = log p_new(y_it):

    clip   -min(r' A, clip(r, 1 - eps, 1 + eps_high) A),  r' = min(r, delta)      PPO / GRPO; GSPO at the sequence level
    cispo  -sg(min(r, eps_high)) A logp_it                                        MiniMax-M1 (CISPO), TRL's cap
    sapo   -(4 / tau) sigmoid(tau (r - 1)) A,  tau = tau_pos if A > 0 else tau_neg  SAPO
    vespo  -sg(phi_i) A logp_it,  phi_i = e^lam w_i^k e^(-lam w_i),                 VESPO
           w_i = exp(sum_t m_it clip(log p_new - log p_old, -20, 20)) [x the sampler weights], (k, lam) by the sign of A

The importance levels (GSPO's is the only difference between token- and sequence-level PPO):

    token     l_it = log p_new(y_it) - log p_old(y_it)                  one ratio per token (PPO, GRPO)
    sequence  l_it = l_i = (1 / n_i) sum_t m_it (log p_new - log p_old)  one ratio per completion (GSPO)

An entry of OBJECTIVES maps (log_ratio [N, L] or [N, 1], logp [N, L], old_logp [N, L], advantages [N],
mask [N, L]) and its keyword hyperparameters to an ObjectiveOutput, and declares:

    hyperparameters                  the keyword arguments it takes (policy_loss passes exactly these)
    zero_gradient_at_zero_advantage  a completion with A_i = 0 has loss 0 and gradient exactly 0 on every token,
                                     whatever r is, at every pass (every objective here multiplies by A_i)
    takes_sampler_weights            it folds the sampler-correction weights into its own weight (vespo, as
                                     TRL); policy_loss then does not multiply the per-token loss by them

Adding an objective: one function, one entry below, one test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch


class ObjectiveOutput(NamedTuple):
    per_token: torch.Tensor  # [N, L] the policy term of each token's loss
    low_clipped: torch.Tensor  # bool, broadcastable to [N, L]: gradient cut on the low side (A < 0)
    high_clipped: torch.Tensor  # bool, broadcastable to [N, L]: gradient cut (or capped) on the high side (A > 0)


@dataclass(frozen=True)
class Objective:
    """A per-token policy objective and the properties the trainer's fast paths rely on."""

    # fn(log_ratio [N, L] or [N, 1], logp [N, L], old_logp [N, L], advantages [N], mask [N, L], **hyperparameters)
    fn: Callable[..., ObjectiveOutput]
    hyperparameters: tuple[str, ...]
    zero_gradient_at_zero_advantage: bool
    takes_sampler_weights: bool = False


# --- log-ratios: (logp [N, L], old_logp [N, L], mask [N, L]) -> broadcastable to [N, L] ------


def token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """l_it = log p_new(y_it) - log p_old(y_it): one ratio per token."""
    return logp - old_logp  # [N, L]


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO: l_i = mean of the per-token log-ratios over completion i's tokens (exp: the geometric mean ratio)."""
    per_seq = ((logp - old_logp) * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [N]
    return per_seq.unsqueeze(-1)  # [N, 1], the same ratio for every token


# Keyed by the values of `algo.importance_sampling_level`.
IMPORTANCE_LEVELS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": token_log_ratio,
    "sequence": sequence_log_ratio,
}


# --- the objectives ----------------------------------------------------------------------------


def clip_objective(
    log_ratio: torch.Tensor,  # [N, L] or [N, 1]
    logp: torch.Tensor,  # [N, L]
    old_logp: torch.Tensor,  # [N, L]
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, L]
    *,
    epsilon: float,
    epsilon_high: float | None,
    delta: float | None,
) -> ObjectiveOutput:
    """PPO / GRPO (GSPO with sequence ratios): loss_it = -min(r' A_i, clip(r, 1 - eps, 1 + eps_high) A_i),
    r' = min(r, delta) when delta is given (TRL's two-sided clipping). epsilon_high=None: symmetric clip.
    Clipped: r < 1 - eps with A < 0, r > 1 + eps_high with A > 0 (the gradient is zero there)."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.unsqueeze(-1)  # [N, 1]
    ratio = torch.exp(log_ratio)  # [N, L] or [N, 1]
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high)  # like ratio
    capped = ratio if delta is None else torch.clamp(ratio, max=delta)  # like ratio
    per_token = -torch.min(capped * adv, clipped * adv)  # like ratio
    r = ratio.detach()
    return ObjectiveOutput(per_token.expand_as(logp), (r < 1 - epsilon) & (adv < 0), (r > 1 + eps_high) & (adv > 0))


def cispo_objective(
    log_ratio: torch.Tensor,  # [N, L] or [N, 1]
    logp: torch.Tensor,  # [N, L]
    old_logp: torch.Tensor,  # [N, L]
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, L]
    *,
    epsilon: float,
    epsilon_high: float | None,
) -> ObjectiveOutput:
    """CISPO (MiniMax-M1): loss_it = -sg(min(r, eps_max)) A_i logp_it: the importance weight is clipped
    and detached, and every token keeps a gradient (no token is dropped as PPO's clip drops them).
    eps_max is epsilon_high itself (TRL's and ScaleRL's convention, e.g. 5.0), falling back to
    epsilon as TRL does. Capped: r > eps_max with A > 0 (TRL's cispo_clip_ratio)."""
    cap = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.unsqueeze(-1)  # [N, 1]
    ratio = torch.exp(log_ratio).detach()  # [N, L] or [N, 1]
    weight = torch.clamp(ratio, max=cap)  # like ratio
    per_token = -weight * adv * logp  # [N, L]
    return ObjectiveOutput(per_token, torch.zeros_like(ratio, dtype=torch.bool), (ratio > cap) & (adv > 0))


def sapo_objective(
    log_ratio: torch.Tensor,  # [N, L] or [N, 1]
    logp: torch.Tensor,  # [N, L]
    old_logp: torch.Tensor,  # [N, L]
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, L]
    *,
    sapo_temperature_pos: float,
    sapo_temperature_neg: float,
) -> ObjectiveOutput:
    """SAPO (soft adaptive policy optimisation): loss_it = -(4 / tau) sigmoid(tau (r - 1)) A_i, a smooth gate
    instead of the hard clip: its derivative in r is 4 s (1 - s) with s = sigmoid(tau (r - 1)), exactly 1 at
    r = 1 and decaying on both sides. tau = tau_pos when A_i > 0, else tau_neg (a larger tau_neg damps
    negative updates faster). Nothing is clipped outright."""
    adv = advantages.unsqueeze(-1)  # [N, 1]
    ratio = torch.exp(log_ratio)  # [N, L] or [N, 1]
    tau = torch.where(adv > 0, adv.new_tensor(sapo_temperature_pos), adv.new_tensor(sapo_temperature_neg))  # [N, 1]
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau  # like ratio
    per_token = -gate * adv  # like ratio
    none = torch.zeros_like(ratio, dtype=torch.bool)
    return ObjectiveOutput(per_token.expand_as(logp), none, none)


# VESPO's clamps on log-weights, as TRL (and the paper's code): exp stays finite.
VESPO_LOG_RATIO_CLAMP = 20.0
VESPO_LOG_WEIGHT_MIN = math.log(1e-8)


def vespo_weight(
    logp: torch.Tensor,  # [N, L]
    old_logp: torch.Tensor,  # [N, L]
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, L]
    sampler_weights: torch.Tensor | None,  # [N, L] or None
    *,
    vespo_k_pos: float,
    vespo_lambda_pos: float,
    vespo_k_neg: float,
    vespo_lambda_neg: float,
) -> torch.Tensor:  # [N, 1], detached
    """VESPO's gamma weight phi(w) = e^lam w^k e^(-lam w) (phi(1) = 1), in log space, of the sequence
    weight w_i = exp(sum_t m_it clamp(l_it, -20, 20) [+ sum_t m_it clamp(log s_it, log 1e-8, 20)]) clamped to
    [1e-8, e^20], with s the sampler-correction weights. (k, lam) = (k_pos, lam_pos) when A_i >= 0, else
    (k_neg, lam_neg); lam is floored at 1e-4 and a non-finite phi becomes 0, as in TRL."""
    with torch.no_grad():
        log_ratio = torch.clamp(logp - old_logp, -VESPO_LOG_RATIO_CLAMP, VESPO_LOG_RATIO_CLAMP)  # [N, L]
        seq = (log_ratio * mask).sum(-1, keepdim=True)  # [N, 1] a sum, not GSPO's mean
        if sampler_weights is not None:
            log_s = torch.clamp(torch.log(sampler_weights), VESPO_LOG_WEIGHT_MIN, VESPO_LOG_RATIO_CLAMP)  # [N, L]
            seq = seq + (log_s * mask).sum(-1, keepdim=True)  # off the mask: nothing (TRL's ratio is 1 there)
        log_w = torch.clamp(seq, VESPO_LOG_WEIGHT_MIN, VESPO_LOG_RATIO_CLAMP)  # [N, 1]
        nonneg = advantages.unsqueeze(-1) >= 0  # [N, 1]
        k = torch.where(nonneg, log_w.new_tensor(vespo_k_pos), log_w.new_tensor(vespo_k_neg))  # [N, 1]
        lam = torch.where(nonneg, log_w.new_tensor(vespo_lambda_pos), log_w.new_tensor(vespo_lambda_neg)).clamp(min=1e-4)
        log_phi = lam + k * log_w - lam * torch.exp(log_w)  # [N, 1]
        return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_objective(
    log_ratio: torch.Tensor,  # [N, L] or [N, 1] (unused: VESPO forms its own sequence weight)
    logp: torch.Tensor,  # [N, L]
    old_logp: torch.Tensor,  # [N, L]
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, L]
    *,
    sampler_weights: torch.Tensor | None,
    vespo_k_pos: float,
    vespo_lambda_pos: float,
    vespo_k_neg: float,
    vespo_lambda_neg: float,
) -> ObjectiveOutput:
    """VESPO (variational sequence-level soft policy optimisation): loss_it = -sg(phi_i) A_i logp_it, a
    smooth asymmetric gamma-shaped weight of the whole completion's importance weight (vespo_weight)
    instead of a hard clip; the sampler-correction weights enter w_i, not the loss. Nothing is clipped outright."""
    phi = vespo_weight(
        logp,
        old_logp,
        advantages,
        mask,
        sampler_weights,
        vespo_k_pos=vespo_k_pos,
        vespo_lambda_pos=vespo_lambda_pos,
        vespo_k_neg=vespo_k_neg,
        vespo_lambda_neg=vespo_lambda_neg,
    )  # [N, 1]
    per_token = -phi * advantages.unsqueeze(-1) * logp  # [N, L]
    none = torch.zeros_like(phi, dtype=torch.bool)
    return ObjectiveOutput(per_token, none, none)


_VESPO = ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")

# Keyed by the objective names LOSS_TYPES (losses.py) refer to.
OBJECTIVES: dict[str, Objective] = {
    "clip": Objective(clip_objective, ("epsilon", "epsilon_high", "delta"), zero_gradient_at_zero_advantage=True),
    "cispo": Objective(cispo_objective, ("epsilon", "epsilon_high"), zero_gradient_at_zero_advantage=True),
    "sapo": Objective(sapo_objective, ("sapo_temperature_pos", "sapo_temperature_neg"), zero_gradient_at_zero_advantage=True),
    "vespo": Objective(vespo_objective, ("sampler_weights", *_VESPO), zero_gradient_at_zero_advantage=True, takes_sampler_weights=True),
}
