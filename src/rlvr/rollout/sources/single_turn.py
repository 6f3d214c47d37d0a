"""The single-turn rollout source: one model turn per episode, on any GenerationEngine.

Each row's prompt is rendered with the chat template, its G completions are sampled by the
engine, and every sampled token is trained (loss mask = attention mask after the prompt).
"""

from __future__ import annotations

import torch

from rlvr.data import render_prompt
from rlvr.data.checks import check_prompt_lengths
from rlvr.models.precision import autocast_context
from rlvr.rollout.engines.protocols import GenerationEngine, SamplingParams
from rlvr.rollout.episodes import Episodes


def as_completions(prompts: list, texts: list[str]) -> list:
    """TRL's convention: chat prompts (lists of messages) get their completions as
    [{"role": "assistant", "content": ...}], text prompts as text. `prompts`: one per completion."""
    return [[{"role": "assistant", "content": t}] if isinstance(p, list) else t for p, t in zip(prompts, texts)]


class SingleTurnSource:
    """RolloutSource: prompt -> G sampled completions, each one model segment."""

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer,
        sampling: SamplingParams,
        *,
        system_prompt: str | None = None,
        context_length: int | None = None,
        autocast: str = "none",
        device: torch.device | str = "cpu",
    ):
        self.engine, self.tokenizer, self.sampling = engine, tokenizer, sampling
        self.system_prompt, self.context_length = system_prompt, context_length
        self.autocast, self.device = autocast, torch.device(device)
        self._compile_seconds = 0.0  # the hf engine's compiled decode (rollout.compile): seconds reported so far

    @property
    def group_size(self) -> int:
        return self.sampling.n

    def rollout(self, rows: list[dict], seeds: list[int]) -> Episodes:
        prompts = [render_prompt(r["prompt"], self.tokenizer, self.system_prompt) for r in rows]
        check_prompt_lengths(prompts, self.tokenizer, self.context_length, self.sampling.max_new_tokens)
        with autocast_context(self.autocast, self.device, getattr(self.engine, "model", None)):
            gen = self.engine.generate(prompts, self.sampling, seeds)
        G = self.group_size
        return Episodes(
            prompt_ids=gen.prompt_ids,
            prompt_mask=gen.prompt_mask,
            completion_ids=gen.completion_ids,
            attention_mask=gen.completion_mask,
            loss_mask=gen.completion_mask,
            sampling_logprobs=gen.sampling_logprobs,
            truncated=gen.truncated,
            group_ids=torch.arange(len(rows), device=gen.completion_ids.device).repeat_interleave(G),
            group_size=G,
            completions=as_completions([r["prompt"] for r in rows for _ in range(G)], gen.texts),
            texts=gen.texts,
            sampling_entropy=gen.sampling_entropy,
            versions=gen.versions,
        )

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def metrics(self, episodes: Episodes) -> dict[str, float]:
        """With rollout.compile=on (the hf engine's compiled decode): its graphs so far and the seconds this step
        spent building them (inside time/generate)."""
        compiled = getattr(self.engine, "compiled", None)
        if compiled is None:
            return {}
        seconds, self._compile_seconds = compiled.clock.seconds - self._compile_seconds, compiled.clock.seconds
        return {"compile/decode_graphs": float(compiled.clock.graphs), "time/compile_decode": seconds}
