"""The clipped GRPO policy loss, its importance-ratio levels, and its loss aggregations.

Per token t of completion i, with log-ratio l = log p_new - log p_old and ratio r = exp(l):

    loss_it = -min(r * A_i, clip(r, 1 - epsilon, 1 + epsilon_high) * A_i) * w_it  [+ beta * KL_it]

(w_it: optional token weights, e.g. the top-entropy mask.)

(r capped at `delta` first when given: TRL's two-sided clipping.) The per-token losses are
then aggregated over the batch by one of LOSS_AGGREGATIONS. Every aggregation is a sum of
per-token terms divided by a constant of the *whole* generation batch (BatchNorms), so the
losses of k micro-batches add up to the full batch's loss: gradient accumulation is exact.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from rlvr.algo.kl import kl_estimate


class BatchNorms(NamedTuple):
    """Sizes of the whole generation batch (all micro-batches, all ranks) that losses divide by."""

    num_sequences: int  # completions in the batch
    num_tokens: int  # completion tokens in the batch (sum of the loss mask)
    max_completion_length: int  # the generation length limit (max_new_tokens)
    num_micro_batches: int = 1  # how many pieces the batch is split into for accumulation


class PolicyLossOutput(NamedTuple):
    loss: torch.Tensor  # [] this micro-batch's share of the batch loss
    low_clipped: torch.Tensor  # [] fraction of tokens with A < 0 and r < 1 - epsilon
    high_clipped: torch.Tensor  # [] fraction of tokens with A > 0 and r > 1 + epsilon_high
    region_clipped: torch.Tensor  # [] fraction clipped on either side
    kl: torch.Tensor | None  # [] mean per-token KL, when beta > 0


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


# --- importance ratio levels: log-ratio per token, [N, L] -> broadcastable to [N, L] ---------


def token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return logp - old_logp  # [N, L]


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO: one ratio per completion, exp of the mean per-token log-ratio."""
    per_seq = ((logp - old_logp) * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [N]
    return per_seq.unsqueeze(-1)  # [N, 1], the same ratio for every token


IMPORTANCE_LEVELS: dict[str, Callable[..., torch.Tensor]] = {
    "token": token_log_ratio,
    "sequence": sequence_log_ratio,
}


# --- aggregations: (per-token loss [N, L], mask [N, L], norms) -> scalar ---------------------


def aggregate_grpo(per_token: torch.Tensor, mask: torch.Tensor, norms: BatchNorms) -> torch.Tensor:
    """Mean over each completion's tokens, then mean over completions (DeepSeekMath)."""
    per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / norms.num_sequences


def aggregate_bnpo(per_token: torch.Tensor, mask: torch.Tensor, norms: BatchNorms) -> torch.Tensor:
    """Token mean over the local (micro-)batch; micro-batches then averaged."""
    return (per_token * mask).sum() / mask.sum().clamp(min=1) / norms.num_micro_batches


def aggregate_dr_grpo(per_token: torch.Tensor, mask: torch.Tensor, norms: BatchNorms) -> torch.Tensor:
    """Sum over tokens divided by completions x max completion length (Dr. GRPO)."""
    return (per_token * mask).sum() / (norms.num_sequences * norms.max_completion_length)


def aggregate_dapo(per_token: torch.Tensor, mask: torch.Tensor, norms: BatchNorms) -> torch.Tensor:
    """Token mean over the whole generation batch (DAPO): every token weighs the same."""
    return (per_token * mask).sum() / max(norms.num_tokens, 1)


LOSS_AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, BatchNorms], torch.Tensor]] = {
    "grpo": aggregate_grpo,
    "bnpo": aggregate_bnpo,
    "dr_grpo": aggregate_dr_grpo,
    "dapo": aggregate_dapo,
}


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
    if loss_type not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss_type must be one of {sorted(LOSS_AGGREGATIONS)}, got {loss_type!r}")
    if importance_level not in IMPORTANCE_LEVELS:
        raise ValueError(f"importance_level must be one of {sorted(IMPORTANCE_LEVELS)}, got {importance_level!r}")
    mask = mask.to(logp.dtype)
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.unsqueeze(-1)  # [N, 1]

    ratio = torch.exp(IMPORTANCE_LEVELS[importance_level](logp, old_logp, mask))  # [N, L] or [N, 1]
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high)
    capped = ratio if delta is None else torch.clamp(ratio, max=delta)
    per_token = -torch.min(capped * adv, clipped * adv)  # [N, L] or [N, 1]
    per_token = per_token.expand_as(logp)  # [N, L]
    if token_weights is not None:  # the policy-gradient term only: the KL still anchors every token (as TRL)
        per_token = per_token * token_weights

    kl = None
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp")
        per_token_kl = kl_estimate(logp, ref_logp, kl_estimator)  # [N, L]
        per_token = per_token + beta * per_token_kl
        kl = masked_mean(per_token_kl.detach(), mask)

    loss = LOSS_AGGREGATIONS[loss_type](per_token, mask, norms)

    with torch.no_grad():
        r = ratio.detach().expand_as(logp)
        low = ((r < 1 - epsilon) & (adv < 0)).to(mask.dtype)
        high = ((r > 1 + eps_high) & (adv > 0)).to(mask.dtype)
        stats = (masked_mean(low, mask), masked_mean(high, mask), masked_mean(torch.maximum(low, high), mask))
    return PolicyLossOutput(loss, *stats, kl)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """1 on the tokens whose entropy is in the top `top_quantile` share of the batch's tokens.

    (Beyond the 80/20 rule: train only on the high-entropy "forking" tokens.) entropy, mask: [N, L].
    """
    if top_quantile >= 1.0:
        return mask.to(entropy.dtype)
    values = entropy[mask.bool()]
    if values.numel() == 0:
        return mask.to(entropy.dtype)
    values = values.to(torch.promote_types(values.dtype, torch.float32))  # fp32 at least, fp64 kept
    threshold = torch.quantile(values, 1.0 - top_quantile)  # [] linear interpolation
    return ((entropy >= threshold) & mask.bool()).to(entropy.dtype)


def _token_truncate(log_w: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.exp(log_w).clamp(max=cap)


def _token_mask(log_w: torch.Tensor, cap: float) -> torch.Tensor:
    w = torch.exp(log_w)
    return torch.where(w <= cap, w, torch.zeros_like(w))


# How to correct for the sampler (e.g. vLLM) and the trainer computing slightly different
# probabilities for the same tokens. w = p_trainer_old / p_sampler per token, detached:
#   token_truncate  min(w, cap)                  (truncated importance sampling, "TIS")
#   token_mask      w where w <= cap, else 0      (masked importance sampling, "MIS")
SAMPLER_CORRECTIONS: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "token_truncate": _token_truncate,
    "token_mask": _token_mask,
}


def sampler_correction(
    old_logp: torch.Tensor,  # [N, L] log p of the policy that sampled, as the trainer computes it
    sampling_logp: torch.Tensor,  # [N, L] log p the sampler reported for the same tokens
    mask: torch.Tensor,  # [N, L]
    mode: str,
    cap: float,
) -> torch.Tensor:
    """Per-token importance weights [N, L] (no gradient, 0 off the mask) that multiply the
    policy-gradient term, so the update is unbiased for the trainer's policy although the tokens
    came from the sampler's slightly different distribution. Pass them as `token_weights`."""
    if mode not in SAMPLER_CORRECTIONS:
        raise ValueError(f"sampler correction must be one of {sorted(SAMPLER_CORRECTIONS)}, got {mode!r}")
    log_w = (old_logp.detach() - sampling_logp).masked_fill(mask == 0, 0.0)
    return SAMPLER_CORRECTIONS[mode](log_w, cap) * mask


def mask_truncated(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Drop completions that hit the length limit without EOS from the loss. mask [N, L], truncated [N]."""
    return mask * (~truncated).unsqueeze(-1).to(mask.dtype)
