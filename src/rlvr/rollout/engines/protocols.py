"""The generation-engine Protocol and what crosses it.

An engine turns prompts (text with the chat template already applied) into G sampled
completions each, and reports the token ids, masks, and the log-prob of each sampled token
under the sampling distribution. Rollout sources (rlvr.rollout.episodes) build episodes on it;
the engines are listed in rlvr.rollout.engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # completions per prompt (the group size G)
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    max_new_tokens: int = 16
    ignore_eos: bool = False  # fixed-length generation (benchmarks)


@dataclass
class Generation:
    """An engine's output: G completions per prompt, prompt-major (rows [i*G, (i+1)*G) are prompt i's)."""

    prompt_ids: torch.Tensor  # [B x G, P] left-padded
    prompt_mask: torch.Tensor  # [B x G, P]
    completion_ids: torch.Tensor  # [B x G, C] right-padded with pad_token_id
    completion_mask: torch.Tensor  # [B x G, C] 1 up to and including EOS
    sampling_logprobs: torch.Tensor  # [B x G, C] log p_sample(token), 0 on padding
    truncated: torch.Tensor  # [B x G] bool: hit max_new_tokens without EOS
    texts: list[str]  # [B x G] decoded completions, special tokens removed
    # [B x G, C] entropy of each sampled token's distribution (at the temperature, before top-k/top-p: the
    # training forward's), 0 on padding; None when the engine does not compute it (vLLM, greedy)
    sampling_entropy: torch.Tensor | None = None


class GenerationEngine(Protocol):
    def generate(self, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int]) -> Generation:
        """Sample params.n completions for each prompt; prompt i's randomness comes from seeds[i] alone."""
        ...

    def sync_weights(self) -> None:
        """Make generation use the trainer's current weights (a no-op when they are shared)."""
        ...


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
