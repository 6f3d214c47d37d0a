"""Per-token weights and masks for the policy-gradient term (policy_loss's `token_weights`, or the loss mask).

high_entropy_mask   w_it = 1[H_it >= quantile_{1-q}(H over the batch's tokens)]   (Beyond the 80/20 rule:
                    train only on the high-entropy "forking" tokens)
sampler_correction  w_it = f(p_trainer_old(y_it) / p_sampler(y_it)), detached, one of SAMPLER_CORRECTIONS
                    (bounds [low, cap], low optional):
                        token_truncate     clamp(w_it, low, cap)              truncated importance sampling ("TIS")
                        token_mask         w_it inside [low, cap], else 0     masked importance sampling ("MIS")
                        sequence_truncate  clamp(W_i, low, cap) on every token of completion i,
                        sequence_mask      W_i inside [low, cap], else 0,     W_i = prod_t w_it over its tokens
                    so the update is unbiased for the trainer's policy although the tokens came from
                    the sampler's (e.g. vLLM's) slightly different distribution (TRL's
                    vllm_importance_sampling_mode; its default is sequence_mask)
mask_truncated      m_it = 0 on completions that hit the length limit without EOS
off_policy_sequence_mask
                    w_i = 0 on a completion with A_i < 0 whose mean log-ratio of the sampler to the current
                    policy, (1 / n_i) sum_t m_it (log p_sampler(y_it) - log p_new(y_it)), exceeds a threshold
                    delta, else 1 (DeepSeek-V3.2's off-policy sequence masking, "OPSM")
"""

from __future__ import annotations

from typing import Callable

import torch


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """1 on the tokens whose entropy is in the top `top_quantile` share of the batch's tokens.

    (Beyond the 80/20 rule: train only on the high-entropy "forking" tokens.) entropy, mask: [N, L] -> [N, L].
    """
    if top_quantile >= 1.0:
        return mask.to(entropy.dtype)  # [N, L]
    values = entropy[mask.bool()]  # [T] the batch's tokens
    if values.numel() == 0:
        return mask.to(entropy.dtype)
    values = values.to(torch.promote_types(values.dtype, torch.float32))  # fp32 at least, fp64 kept
    threshold = torch.quantile(values, 1.0 - top_quantile)  # [] linear interpolation
    return ((entropy >= threshold) & mask.bool()).to(entropy.dtype)  # [N, L]


def _clamp(w: torch.Tensor, low: float | None, cap: float) -> torch.Tensor:
    return w.clamp(min=low, max=cap)


def _zero_outside(w: torch.Tensor, low: float | None, cap: float) -> torch.Tensor:
    outside = w > cap if low is None else (w > cap) | (w < low)
    return w.masked_fill(outside, 0.0)


def _token_truncate(log_w: torch.Tensor, mask: torch.Tensor, low: float | None, cap: float) -> torch.Tensor:
    """Truncated importance sampling (TIS): each token's w clamped to [low, cap]. [N, L] -> [N, L], 0 off the mask."""
    return _clamp(torch.exp(log_w), low, cap) * mask


def _token_mask(log_w: torch.Tensor, mask: torch.Tensor, low: float | None, cap: float) -> torch.Tensor:
    """Masked importance sampling (MIS): each token's w where it lies in [low, cap], else 0. [N, L] -> [N, L]."""
    return _zero_outside(torch.exp(log_w), low, cap) * mask


def _sequence_truncate(log_w: torch.Tensor, mask: torch.Tensor, low: float | None, cap: float) -> torch.Tensor:
    """One weight per completion, the product of its tokens' w, clamped to [low, cap]. [N, L] -> [N, 1]."""
    return _clamp(torch.exp(log_w.sum(-1, keepdim=True)), low, cap)


def _sequence_mask(log_w: torch.Tensor, mask: torch.Tensor, low: float | None, cap: float) -> torch.Tensor:
    """One weight per completion, the product of its tokens' w, where it lies in [low, cap], else 0. [N, L] -> [N, 1]."""
    return _zero_outside(torch.exp(log_w.sum(-1, keepdim=True)), low, cap)


# How to correct for the sampler and the trainer computing slightly different probabilities for
# the same tokens; keyed by the values of `algo.sampler_correction` (besides auto / none). Each takes the masked
# log-ratios log w [N, L], the mask and the bounds.
SAMPLER_CORRECTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, float | None, float], torch.Tensor]] = {
    "token_truncate": _token_truncate,
    "token_mask": _token_mask,
    "sequence_truncate": _sequence_truncate,
    "sequence_mask": _sequence_mask,
}


def sampler_correction(
    old_logp: torch.Tensor,  # [N, L] log p of the policy that sampled, as the trainer computes it
    sampling_logp: torch.Tensor,  # [N, L] log p the sampler reported for the same tokens
    mask: torch.Tensor,  # [N, L]
    mode: str,
    cap: float,
    low: float | None = None,
) -> torch.Tensor:  # [N, L] token modes (0 off the mask); [N, 1] sequence modes
    """Importance weights (no gradient) that multiply the policy-gradient term, so the update is unbiased for the
    trainer's policy although the tokens came from the sampler's slightly different distribution. Pass them as
    `sampler_weights`. A token the sampler gave no log-prob (NaN) counts as agreeing (log-ratio 0), as in TRL."""
    if mode not in SAMPLER_CORRECTIONS:
        raise ValueError(f"sampler correction must be one of {sorted(SAMPLER_CORRECTIONS)}, got {mode!r}")
    log_w = torch.nan_to_num((old_logp.detach() - sampling_logp).masked_fill(mask == 0, 0.0), nan=0.0)  # [N, L]
    return SAMPLER_CORRECTIONS[mode](log_w, mask, low, cap)


def mask_truncated(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Drop completions that hit the length limit without EOS from the loss. mask [N, L], truncated [N] -> [N, L]."""
    return mask * (~truncated).unsqueeze(-1).to(mask.dtype)


def off_policy_sequence_mask(
    advantages: torch.Tensor,  # [N]
    logp: torch.Tensor,  # [N, L] the current policy's log-probs (their gradient is not used)
    sampling_logp: torch.Tensor,  # [N, L] the sampler's log-probs of the same tokens
    mask: torch.Tensor,  # [N, L]
    threshold: float,
) -> torch.Tensor:  # [N, 1]
    """DeepSeek-V3.2's off-policy sequence mask: 1 keeps a completion, 0 drops it from the policy-gradient
    term. Dropped: A_i < 0 and (1 / n_i) sum_t m_it (log p_sampler - log p_new) > threshold (a k1 estimate of
    KL(sampler || policy) over the completion: it has drifted too far for a negative update to be trusted).
    Tokens whose sampler log-prob is NaN (unscored) count 0, as TRL. Exactly TRL's get_off_policy_mask."""
    drift = torch.nan_to_num(sampling_logp - logp.detach(), nan=0.0)  # [N, L]
    mean_drift = (drift * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # [N, 1]
    keep = (advantages.unsqueeze(-1) >= 0) | (mean_drift <= threshold)  # [N, 1]
    return keep.to(mask.dtype)
