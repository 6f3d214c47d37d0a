"""Sampling shared by the engines: top-k/top-p filtering, the hf engines' inverse-CDF sampler,
and the seed of each episode's noise."""

from __future__ import annotations

import torch

SEED_RANGE = 2**63  # torch.Generator and vLLM take seeds below this


def row_seed(seed: int, sample: int, request: int | None = None) -> int:
    """The seed of sample `sample` of a prompt seeded `seed` (and of its `request`-th generation request,
    for an engine that makes one per model turn): the G samples of a prompt draw apart, and none
    depends on the batch it is in."""
    s = int(seed) * 9973 + sample
    if request is not None:
        s = s * 1009 + request
    return s % SEED_RANGE


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside top-k and outside the top-p nucleus with -inf."""  # logits: [N, V]
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(logits: torch.Tensor, uniforms: torch.Tensor, *, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """One token per row by inverse-CDF sampling: the first token whose cumulative probability
    exceeds u * total, u ~ U[0, 1) given per row. Exact in distribution (the CDF is summed in
    float64, so no token's share is off by more than ~1e-12, and a token of probability 0 is never
    chosen: cdf[i] > u * total >= cdf[i - 1] needs p_i > 0), and one random number per row instead
    of one per row and vocabulary entry (the exponential race drew 49152 per row on SmolLM2: a
    fifth of its decode). Returns (token [n], its log-prob [n], entropy [n]): the entropy of the
    whole distribution at this temperature (before top-k/top-p), as the training forward computes it."""
    scaled = logits / temperature  # [n, V]
    filtered = top_k or top_p < 1.0
    logp_all = (filter_logits(scaled, top_k, top_p) if filtered else scaled).log_softmax(-1)  # [n, V]
    p = logp_all.exp()
    cdf = p.double().cumsum(-1)  # [n, V]
    token = torch.searchsorted(cdf, (uniforms.double() * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)  # [n]
    if filtered:
        logp_full = scaled.log_softmax(-1)
        entropy = -(logp_full.exp() * logp_full).nansum(-1)
    else:
        entropy = -(p * logp_all).nansum(-1)  # nansum: 0 * log 0 = 0 for logits at -inf
    return token, logp_all.gather(-1, token[:, None]).squeeze(-1), entropy
