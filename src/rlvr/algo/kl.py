"""Per-token estimators of KL(policy || reference) from log-probs of sampled tokens (Schulman 2020).

With log_ratio = ref_logp - logp (tokens sampled from the policy):
  k1 = -log_ratio                      unbiased, can be negative
  k2 = log_ratio**2 / 2                biased, low variance, >= 0
  k3 = exp(log_ratio) - log_ratio - 1  unbiased, >= 0 (DeepSeekMath's choice, the default)
"""

from __future__ import annotations

import torch


def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log p - log p_ref: unbiased, can be negative. [N, L] -> [N, L]."""
    return logp - ref_logp


def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = (log p_ref - log p)^2 / 2: biased, low variance, >= 0. [N, L] -> [N, L]."""
    return 0.5 * (ref_logp - logp) ** 2


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = p_ref / p - log(p_ref / p) - 1: unbiased, >= 0 (DeepSeekMath). [N, L] -> [N, L]."""
    log_ratio = ref_logp - logp  # [N, L]
    return torch.exp(log_ratio) - log_ratio - 1


# Keyed by the values of `algo.kl_estimator`.
KL_ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL estimate, same shape as the inputs ([N, L])."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl estimator must be one of {sorted(KL_ESTIMATORS)}, got {estimator!r}")
    return KL_ESTIMATORS[estimator](logp, ref_logp)
