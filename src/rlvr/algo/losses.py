"""The GRPO policy loss: an objective (objectives.py), token weights, a KL term, an aggregation (aggregations.py).

Per token t of completion i, with ratio r (per token or per completion, by `importance_level`):

    loss_it = -min(r' * A_i, clip(r, 1 - epsilon, 1 + epsilon_high) * A_i) * w_it  [+ beta * KL_it]

(r' = min(r, delta) when delta is given: TRL's two-sided clipping; w_it: optional token weights,
e.g. the top-entropy mask or sampler-correction weights.) The per-token losses are then aggregated
over the batch by one of LOSS_AGGREGATIONS, whose normalisers come from the whole generation batch
(BatchNorms), so the losses of k micro-batches add up to the full batch's loss (bnpo aside).

The registries' declared properties answer what the trainer may leave out or reorder:
zero_advantage_rows_have_zero_gradient and rows_can_be_regrouped.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rlvr.algo.aggregations import LOSS_AGGREGATIONS, Aggregation, BatchNorms
from rlvr.algo.kl import kl_estimate
from rlvr.algo.objectives import OBJECTIVES, Objective


class PolicyLossOutput(NamedTuple):
    loss: torch.Tensor  # [] this micro-batch's share of the batch loss
    low_clipped: torch.Tensor  # [] fraction of tokens with A < 0 and r < 1 - epsilon
    high_clipped: torch.Tensor  # [] fraction of tokens with A > 0 and r > 1 + epsilon_high
    region_clipped: torch.Tensor  # [] fraction clipped on either side
    kl: torch.Tensor | None  # [] mean per-token KL, when beta > 0


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(x * mask) / max(sum(mask), 1). x, mask: broadcastable -> []."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def _aggregation(loss_type: str) -> Aggregation:
    if loss_type not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss_type must be one of {sorted(LOSS_AGGREGATIONS)}, got {loss_type!r}")
    return LOSS_AGGREGATIONS[loss_type]


def _objective(importance_level: str) -> Objective:
    if importance_level not in OBJECTIVES:
        raise ValueError(f"importance_level must be one of {sorted(OBJECTIVES)}, got {importance_level!r}")
    return OBJECTIVES[importance_level]


def policy_loss(
    logp: torch.Tensor,  # [N, L] log p_theta(token), with gradient
    old_logp: torch.Tensor,  # [N, L] log p of the policy that sampled, no gradient
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, L] 1 on completion tokens that count
    norms: BatchNorms,
    *,
    loss_type: str = "dapo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    importance_level: str = "token",
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,  # [N, L] when beta > 0
    kl_estimator: str = "k3",
    token_weights: torch.Tensor | None = None,  # [N, L] e.g. a high-entropy token mask
) -> PolicyLossOutput:
    """This micro-batch's share of the batch loss, with clip fractions and the mean KL.

    The aggregation's normaliser comes from `norms` (the whole generation batch), so summing the
    losses (and gradients) of the micro-batches gives the full batch's loss exactly (bnpo aside,
    which by definition normalises by the local batch). `token_weights` multiplies the
    policy-gradient term only; the KL term, when beta > 0, counts on every unmasked token.
    """
    aggregate = _aggregation(loss_type).fn
    objective = _objective(importance_level).fn
    mask = mask.to(logp.dtype)  # [N, L]
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.unsqueeze(-1)  # [N, 1]

    per_token, ratio = objective(logp, old_logp, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high,
                                 delta=delta)  # [N, L], [N, L] or [N, 1]
    if token_weights is not None:  # the policy-gradient term only: the KL still anchors every token (as TRL)
        per_token = per_token * token_weights  # [N, L]

    kl = None
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp")
        per_token_kl = kl_estimate(logp, ref_logp, kl_estimator)  # [N, L]
        per_token = per_token + beta * per_token_kl  # [N, L]
        kl = masked_mean(per_token_kl.detach(), mask)  # []

    loss = aggregate(per_token, mask, norms)  # []

    with torch.no_grad():
        r = ratio.detach().expand_as(logp)  # [N, L]
        low = ((r < 1 - epsilon) & (adv < 0)).to(mask.dtype)  # [N, L]
        high = ((r > 1 + eps_high) & (adv > 0)).to(mask.dtype)  # [N, L]
        stats = (masked_mean(low, mask), masked_mean(high, mask), masked_mean(torch.maximum(low, high), mask))
    return PolicyLossOutput(loss, *stats, kl)


def rows_can_be_regrouped(loss_type: str) -> bool:
    """True when micro-batches may be formed from any subset of the rows, in any order, without
    changing the summed loss and gradient: the aggregation's normalisers are whole-batch constants
    (every loss_type but bnpo, which normalises by the local micro-batch's token count)."""
    return not _aggregation(loss_type).normalises_per_micro_batch


def zero_advantage_rows_have_zero_gradient(*, loss_type: str, importance_level: str, beta: float) -> bool:
    """True when a completion whose advantage is exactly 0 contributes exactly zero gradient AND
    leaving it out of the forward/backward changes nothing else, so the trainer may skip it:
    the objective declares zero_gradient_at_zero_advantage, there is no KL term (beta == 0: the KL
    has a gradient at A = 0), and the aggregation does not normalise per micro-batch.

    Per-token weights do not change this (they multiply a zero term); weights computed from the
    whole batch, as the top-entropy quantile, are the caller's to keep unchanged."""
    return (_objective(importance_level).zero_gradient_at_zero_advantage and beta == 0
            and rows_can_be_regrouped(loss_type))
