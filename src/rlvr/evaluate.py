"""Held-out evaluation: greedy completions scored by a task's verifier."""

from __future__ import annotations

from rlvr.data import render_prompt
from rlvr.rewards import RewardRunner
from rlvr.rollout import GenerationEngine, SamplingParams


def evaluate(engine: GenerationEngine, tokenizer, rows: list[dict], reward: RewardRunner, *, max_new_tokens: int, batch_size: int = 128) -> float:
    """Mean of the (first) reward over greedy completions of `rows`: accuracy for 0/1 verifiers."""
    total = 0.0
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens)
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        texts = [render_prompt(r["prompt"], tokenizer) for r in chunk]
        out = engine.generate(texts, params, seeds=list(range(len(chunk))))
        columns = {k: [r.get(k) for r in chunk] for k in chunk[0] if k != "prompt"}
        scores = reward([r["prompt"] for r in chunk], as_completions(chunk, out.texts), columns)[:, 0]
        total += float(scores.nansum())
    return total / len(rows)


def as_completions(rows: list[dict], texts: list[str]) -> list:
    """TRL's convention: chat prompts get completions as [{"role": "assistant", "content": ...}]."""
    per_row = len(texts) // len(rows)
    out = []
    for i, t in enumerate(texts):
        chat = isinstance(rows[i // per_row]["prompt"], list)
        out.append([{"role": "assistant", "content": t}] if chat else t)
    return out
