"""Keeping exploration alive: the adaptive entropy coefficient and the covariance-based remedies.

Adaptive entropy control (Skywork-OR1, He et al. 2025; TRL 1.16's `use_adaptive_entropy`): the entropy
bonus coefficient c moves by delta after every optimizer step, up while the measured entropy H is at or below
a target, down otherwise, within [c_min, c_max]; the bonus applied during a step is c while the entropy
measured at the previous step was at or below the target, else 0 (before any measurement: 0).

    c_{k+1} = min(c_k + delta, c_max)  if H_k <= target        applied_k = c_k  if H_{k-1} <= target
              max(c_k - delta, c_min)  otherwise                           0    otherwise

With no target given (rlvr's addition, the doctor's proposal made automatic), the target is half the mean entropy
of the first AUTO_TARGET_STEPS optimizer steps, during which the coefficient waits and no bonus applies:

    target = AUTO_TARGET_SHARE x mean(H_1 .. H_n),  n = AUTO_TARGET_STEPS;  the rule above from step n on.

Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models"): entropy falls where tokens with a high covariance between their log-probability and their advantage
are reinforced,

    cov_it = (log p(y_it) - mean log p) * (A_i - mean A)      (means over the batch's loss tokens)

so Clip-Cov detaches the policy gradient of a random `ratio` share of the tokens whose covariance lies in
(lower, upper) (and whose clipped objective did not already stop them), and KL-Cov adds |log p_new - log p_old|
times a coefficient to the loss of the top `ratio` share of tokens by covariance.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


AUTO_TARGET_STEPS = 5  # an automatic target averages the entropy of this many first optimizer steps
AUTO_TARGET_SHARE = 0.5  # ... and steers to this share of it


class EntropyControl(NamedTuple):
    coef: float  # the coefficient reached (TRL's entropy_coef as it moves)
    last_entropy: float  # the entropy measured at the last optimizer step (inf before the first)
    target: float | None  # the entropy steered to (None: automatic, not measured yet)
    measured: tuple[float, ...] = ()  # automatic target: the entropies of the steps before it is set


def start_entropy_control(coef: float, *, target: float | None) -> EntropyControl:
    """The controller before the first step: `coef` (algo.entropy_coef) as the starting coefficient; `target` None
    sets the target from the first AUTO_TARGET_STEPS steps."""
    return EntropyControl(float(coef), math.inf, None if target is None else float(target))


def applied_entropy_coef(state: EntropyControl) -> float:
    """The coefficient every micro-batch of the next optimizer step applies."""
    return state.coef if state.target is not None and state.last_entropy <= state.target else 0.0


def next_entropy_control(state: EntropyControl, entropy: float, *, delta: float, coef_min: float, coef_max: float) -> EntropyControl:
    """The controller after an optimizer step whose tokens had mean entropy `entropy`."""
    entropy = float(entropy)
    if state.target is None:  # automatic target: measuring; the step that completes the measurement moves c too
        measured = (*state.measured, entropy)
        if len(measured) < AUTO_TARGET_STEPS:
            return state._replace(last_entropy=entropy, measured=measured)
        state = state._replace(target=AUTO_TARGET_SHARE * math.fsum(measured) / len(measured), measured=())
    assert state.target is not None
    if entropy <= state.target:
        return state._replace(coef=min(state.coef + delta, coef_max), last_entropy=entropy)
    return state._replace(coef=max(state.coef - delta, coef_min), last_entropy=entropy)


def token_covariance(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """cov_it = (log p_it - mean log p) (A_i - mean A), both means over the mask's tokens; 0 off the mask.
    logp, mask: [N, L]; advantages: [N] -> [N, L] (no gradient)."""
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1)
    adv = advantages.detach().to(logp.dtype).unsqueeze(1).expand_as(logp)  # [N, L]
    lp = logp.detach()
    return (lp - (lp * m).sum() / n) * (adv - (adv * m).sum() / n) * m


def clip_cov_weights(
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ratio: float,
    lower: float,
    upper: float,
    already_clipped: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Clip-Cov: [N, L] weights, 0 on max(1, floor(ratio x tokens)) tokens drawn at random among those with
    lower < cov < upper (not `already_clipped`), 1 elsewhere. Multiplying the per-token loss by them detaches those
    tokens' gradient; the loss normalisers do not change."""
    cov = token_covariance(logp, advantages, mask)
    eligible = (cov > lower) & (cov < upper) & mask.bool()
    if already_clipped is not None:
        eligible &= ~already_clipped.bool()
    idx = eligible.flatten().nonzero().squeeze(-1)
    take = min(max(int(ratio * float(mask.sum())), 1), len(idx))
    weights = torch.ones_like(logp, dtype=logp.dtype)
    if take:
        chosen = idx[torch.randperm(len(idx), generator=generator, device="cpu")[:take].to(idx.device)]
        weights.view(-1)[chosen] = 0.0
    return weights


def kl_cov_selection(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *, ratio: float) -> torch.Tensor:
    """KL-Cov: [N, L] 1 on the top max(1, floor(ratio x tokens)) tokens by covariance (the mask's tokens only)."""
    cov = token_covariance(logp, advantages, mask)
    n = int(mask.sum())
    selected = torch.zeros_like(logp, dtype=logp.dtype)
    if n == 0:
        return selected
    k = max(1, int(n * ratio))
    scores = torch.where(mask.bool(), cov, torch.full_like(cov, -math.inf)).flatten()
    selected.view(-1)[torch.topk(scores, k).indices] = 1.0
    return selected


def kl_cov_penalty(logp: torch.Tensor, old_logp: torch.Tensor, selected: torch.Tensor, *, coef: float) -> torch.Tensor:
    """KL-Cov's per-token addition to the loss: coef x |log p_new - log p_old| on the selected tokens. [N, L] -> [N, L]."""
    return coef * (logp - old_logp).abs() * selected
