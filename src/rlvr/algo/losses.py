"""The GRPO policy loss: an objective (objectives.py), token weights, a KL term, an aggregation
(aggregations.py) and an entropy bonus.

A loss type (`algo.loss_type`, TRL's names and meanings) is an objective and an aggregation:

    grpo  bnpo  dr_grpo  dapo   the clipped objective, aggregated four ways
    cispo                       CISPO's clipped, detached weight x logp; dapo's token mean
    sapo                        SAPO's soft gate; grpo's per-completion mean
    vespo                       VESPO's gamma weight of the sequence ratio x logp; dapo's token mean
    luspo                       the clipped objective; per-completion sum, mean over completions

Per token t of completion i, with ratio r (per token or per completion, by `importance_level`):

    loss_it = objective_it * o_i * w_it * s_it  [+ beta * KL_it [* r]]

(o_i: the off-policy sequence mask when a threshold is given; w_it: token weights, e.g. the
top-entropy mask; s_it: the sampler-correction weights, unless the objective takes them itself;
the KL term times r with `kl_bias_correction`.) The per-token losses are then aggregated over the
batch, with normalisers from the whole generation batch (BatchNorms), so the losses of k
micro-batches add up to the full batch's loss (bnpo aside). The entropy bonus subtracts
entropy_coef x the mean entropy over the batch's loss tokens (those w keeps), with its gradient.

The registries' declared properties answer what the trainer may leave out or reorder:
zero_advantage_rows_have_zero_gradient and rows_can_be_regrouped.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from rlvr.algo.aggregations import LOSS_AGGREGATIONS, Aggregation, BatchNorms
from rlvr.algo.kl import kl_estimate
from rlvr.algo.objectives import IMPORTANCE_LEVELS, OBJECTIVES, Objective
from rlvr.algo.token_weights import off_policy_sequence_mask


class LossType(NamedTuple):
    objective: str  # a key of OBJECTIVES
    aggregation: str  # a key of LOSS_AGGREGATIONS


# Keyed by the values of `algo.loss_type` (TRL's loss_type names, with TRL's pairing of objective and aggregation).
LOSS_TYPES: dict[str, LossType] = {
    "grpo": LossType("clip", "grpo"),
    "bnpo": LossType("clip", "bnpo"),
    "dr_grpo": LossType("clip", "dr_grpo"),
    "dapo": LossType("clip", "dapo"),
    "cispo": LossType("cispo", "dapo"),
    "sapo": LossType("sapo", "grpo"),
    "vespo": LossType("vespo", "dapo"),
    "luspo": LossType("clip", "luspo"),
}


class PolicyLossOutput(NamedTuple):
    loss: torch.Tensor  # [] this micro-batch's share of the batch loss
    low_clipped: torch.Tensor  # [] fraction of tokens the objective clips on the low side (A < 0)
    high_clipped: torch.Tensor  # [] fraction of tokens the objective clips or caps on the high side (A > 0)
    region_clipped: torch.Tensor  # [] fraction clipped on either side
    kl: torch.Tensor | None  # [] mean per-token KL estimate (without the bias correction), when beta > 0


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(x * mask) / max(sum(mask), 1). x, mask: broadcastable -> []."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def _loss_type(loss_type: str) -> tuple[Objective, Aggregation]:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {sorted(LOSS_TYPES)}, got {loss_type!r}")
    objective, aggregation = LOSS_TYPES[loss_type]
    return OBJECTIVES[objective], LOSS_AGGREGATIONS[aggregation]


def _log_ratio_fn(importance_level: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    if importance_level not in IMPORTANCE_LEVELS:
        raise ValueError(f"importance_level must be one of {sorted(IMPORTANCE_LEVELS)}, got {importance_level!r}")
    return IMPORTANCE_LEVELS[importance_level]


def policy_loss(
    logp: torch.Tensor,  # [N, L] log p_theta(token), with gradient
    old_logp: torch.Tensor,  # [N, L] log p of the policy that generated the batch, no gradient
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, L] 1 on completion tokens that count
    norms: BatchNorms,
    *,
    loss_type: str = "dapo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    importance_level: str = "token",
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,  # [N, L] when beta > 0
    kl_estimator: str = "k3",
    kl_bias_correction: bool = False,
    token_weights: torch.Tensor | None = None,  # [N, L] e.g. a high-entropy token mask
    sampler_weights: torch.Tensor | None = None,  # [N, L] sampler-correction weights (sampler_correction)
    off_policy_mask_threshold: float | None = None,
    sampling_logp: torch.Tensor | None = None,  # [N, L] the sampler's log-probs, for the off-policy mask
    entropy: torch.Tensor | None = None,  # [N, L] with gradient, when entropy_coef != 0
    entropy_coef: float = 0.0,
    token_penalty: torch.Tensor | None = None,  # [N, L] added to the per-token loss (KL-Cov's), with its gradient
    entropy_weights: torch.Tensor | None = None,  # [N, L] the tokens the entropy bonus averages over (None: token_weights)
) -> PolicyLossOutput:
    """This micro-batch's share of the batch loss, with clip fractions and the mean KL.

    The aggregation's normaliser comes from `norms` (the whole generation batch), so summing the
    losses (and gradients) of the micro-batches gives the full batch's loss exactly (bnpo aside,
    which by definition normalises by the local batch). `token_weights`, `sampler_weights` and the
    off-policy mask multiply the policy-gradient term only; the KL term, when beta > 0, counts on
    every unmasked token. The entropy bonus averages over the tokens `entropy_weights` keeps (default: those
    `token_weights` keeps; Clip-Cov's detached tokens stay in the bonus, as in verl). `token_penalty` adds
    to the per-token loss before the aggregation (KL-Cov's |log-ratio| on its selected tokens).
    """
    objective, aggregation = _loss_type(loss_type)
    mask = mask.to(logp.dtype)  # [N, L]
    log_ratio = _log_ratio_fn(importance_level)(logp, old_logp, mask)  # [N, L] or [N, 1]
    hyper = dict(
        epsilon=epsilon,
        epsilon_high=epsilon_high,
        delta=delta,
        sampler_weights=sampler_weights,
        sapo_temperature_pos=sapo_temperature_pos,
        sapo_temperature_neg=sapo_temperature_neg,
        vespo_k_pos=vespo_k_pos,
        vespo_lambda_pos=vespo_lambda_pos,
        vespo_k_neg=vespo_k_neg,
        vespo_lambda_neg=vespo_lambda_neg,
    )
    out = objective.fn(log_ratio, logp, old_logp, advantages, mask, **{k: hyper[k] for k in objective.hyperparameters})
    per_token = _weighted(
        out.per_token,
        objective,
        advantages,
        logp,
        mask,
        token_weights=token_weights,
        sampler_weights=sampler_weights,
        off_policy_mask_threshold=off_policy_mask_threshold,
        sampling_logp=sampling_logp,
    )  # [N, L]
    if token_penalty is not None:
        per_token = per_token + token_penalty  # [N, L]
    kl = None
    if beta != 0.0:
        per_token_kl, kl = _kl_term(logp, ref_logp, log_ratio, mask, kl_estimator=kl_estimator, kl_bias_correction=kl_bias_correction)
        per_token = per_token + beta * per_token_kl  # [N, L]
    loss = aggregation.fn(per_token, mask, norms)  # []
    if entropy_coef != 0.0:
        kept = token_weights if entropy_weights is None else entropy_weights
        loss = loss - _entropy_bonus(entropy, mask, kept, norms, entropy_coef=entropy_coef)
    return PolicyLossOutput(loss, *_clip_fractions(out.low_clipped, out.high_clipped, logp, mask), kl)


def _weighted(
    per_token: torch.Tensor,
    objective: Objective,
    advantages: torch.Tensor,
    logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    token_weights: torch.Tensor | None,
    sampler_weights: torch.Tensor | None,
    off_policy_mask_threshold: float | None,
    sampling_logp: torch.Tensor | None,
) -> torch.Tensor:
    """objective_it * o_i * w_it * s_it: the policy-gradient term's weights. [N, L] -> [N, L]."""
    if off_policy_mask_threshold is not None:
        if sampling_logp is None:
            raise ValueError("off_policy_mask_threshold needs sampling_logp")
        per_token = per_token * off_policy_sequence_mask(advantages, logp, sampling_logp, mask, off_policy_mask_threshold)
    if token_weights is not None:  # the policy-gradient term only: the KL still anchors every token (as TRL)
        per_token = per_token * token_weights  # [N, L]
    if sampler_weights is not None and not objective.takes_sampler_weights:
        per_token = per_token * sampler_weights  # [N, L]
    return per_token


def _kl_term(
    logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_estimator: str,
    kl_bias_correction: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL_it [x r_it with the bias correction], the mean KL estimate over the mask []): [N, L] -> [N, L], []."""
    if ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp")
    per_token_kl = kl_estimate(logp, ref_logp, kl_estimator)  # [N, L]
    kl = masked_mean(per_token_kl.detach(), mask)  # []
    if kl_bias_correction:  # x r (with its gradient): the unbiased gradient of KL(policy || ref) (DeepSeek-V3.2)
        per_token_kl = per_token_kl * torch.exp(log_ratio)  # [N, L]
    return per_token_kl, kl


def _entropy_bonus(
    entropy: torch.Tensor | None, mask: torch.Tensor, token_weights: torch.Tensor | None, norms: BatchNorms, *, entropy_coef: float
) -> torch.Tensor:
    """entropy_coef * sum(H_it * mask_it * w_it) / (the batch's tokens that w keeps), with its gradient. [N, L] -> []."""
    if entropy is None:
        raise ValueError("entropy_coef != 0 needs entropy")
    kept = mask if token_weights is None else mask * token_weights  # [N, L]
    n = norms.num_tokens if norms.num_entropy_tokens is None else norms.num_entropy_tokens
    return entropy_coef * (entropy * kept).sum() / max(n, 1)


@torch.no_grad()
def _clip_fractions(
    low_clipped: torch.Tensor, high_clipped: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(low, high, either side): fractions of the masked tokens clipped. [N, L] or [N, 1] -> [] each."""
    low = low_clipped.expand_as(logp).to(mask.dtype)  # [N, L]
    high = high_clipped.expand_as(logp).to(mask.dtype)  # [N, L]
    return masked_mean(low, mask), masked_mean(high, mask), masked_mean(torch.maximum(low, high), mask)


def rows_can_be_regrouped(loss_type: str) -> bool:
    """True when micro-batches may be formed from any subset of the rows, in any order, without
    changing the summed loss and gradient: the aggregation's normalisers are whole-batch constants
    (every loss_type but bnpo, which normalises by the local micro-batch's token count). The
    objectives and the entropy bonus are per-row, over whole-batch normalisers too."""
    return not _loss_type(loss_type)[1].normalises_per_micro_batch


def zero_advantage_rows_have_zero_gradient(*, loss_type: str, beta: float, entropy_coef: float = 0.0) -> bool:
    """True when a completion whose advantage is exactly 0 contributes exactly zero gradient AND
    leaving it out of the forward/backward changes nothing else, so the trainer may skip it:
    the objective declares zero_gradient_at_zero_advantage, there is no KL term (beta == 0: the KL
    has a gradient at A = 0), no entropy bonus (nor has the entropy), and the aggregation does not
    normalise per micro-batch.

    Per-token weights and the off-policy mask do not change this (they multiply a zero term, and
    the mask keeps every row with A >= 0); weights computed from the whole batch, as the top-entropy
    quantile, are the caller's to keep unchanged."""
    objective, aggregation = _loss_type(loss_type)
    return objective.zero_gradient_at_zero_advantage and beta == 0 and entropy_coef == 0 and not aggregation.normalises_per_micro_batch
