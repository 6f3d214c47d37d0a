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
