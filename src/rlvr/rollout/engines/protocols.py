"""The engine Protocols and what crosses them.

A GenerationEngine turns prompts (text with the chat template already applied) into G sampled
completions each, and reports the token ids, masks, and the log-prob of each sampled token
under the sampling distribution. A MultiTurnEngine also decodes episodes whose turns are
interleaved with external tokens (tool results), asking a TurnDriver (rlvr.rollout.engines.turns)
between turns. Rollout sources (rlvr.rollout.sources) build episodes on them; the engines are
listed in rlvr.rollout.engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch

from rlvr.rollout.engines.turns import Trace, TurnDriver


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # completions per prompt (the group size G)
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    max_new_tokens: int = 16
    ignore_eos: bool = False  # fixed-length generation (benchmarks)
    min_p: float = 0.0  # 0 disables: tokens below min_p x the most probable one's probability are not drawn
    repetition_penalty: float = 1.0  # 1 disables: seen tokens' logits / it (positive) or x it (negative), before temperature


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
    versions: torch.Tensor | None = None  # [B x G] long: the weight version each row was sampled under (servers); None: the trainer's own


class GenerationEngine(Protocol):
    """What single-turn rollouts run on (rlvr.rollout.sources.single_turn)."""

    @property
    def model(self) -> torch.nn.Module:
        """The trainer's model: the one the engine samples with (hf) or copies weights from (vllm); a
        rollout function (rlvr.rollout.sources.function) generates with it."""
        ...

    def generate(self, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int]) -> Generation:
        """Sample params.n completions for each prompt; prompt i's randomness comes from seeds[i] alone."""
        ...

    def sync_weights(self) -> None:
        """Make generation use the trainer's current weights (a no-op when they are shared)."""
        ...


@runtime_checkable
class MultiTurnEngine(Protocol):
    """What multi-turn rollouts run on (rlvr.rollout.sources.multi_turn): episodes of model turns and
    external tokens. The hf and vllm engines implement it besides GenerationEngine."""

    def generate_episodes(
        self, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int], driver: TurnDriver
    ) -> tuple[torch.Tensor, torch.Tensor, list[Trace]]:
        """params.n episodes per prompt: (prompt_ids [B, P] left-padded, prompt_mask [B, P], one Trace per
        episode, prompt-major). params.max_new_tokens bounds each episode's tokens after the prompt
        (model and external); prompt i's randomness comes from seeds[i] alone."""
        ...

    def sync_weights(self) -> None:
        """Make generation use the trainer's current weights (a no-op when they are shared)."""
        ...
