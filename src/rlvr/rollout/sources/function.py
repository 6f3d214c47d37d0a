"""A user's rollout function as a rollout source (TRL's `rollout_func`, `rollout.function` in config).

The function makes the episodes itself, with any generation code:

    def my_rollout(prompts, *, model, tokenizer, sampling, seeds) -> dict

`prompts`: one per group (a row's prompt: text or chat messages, not rendered, not repeated);
`sampling`: rlvr.rollout.SamplingParams (sampling.n episodes per prompt); `seeds`: one per prompt.
It returns, per episode (len(prompts) x sampling.n of them, prompt-major), the keys TRL's
rollout_func returns: `prompt_ids`, `completion_ids`, `logprobs` (the sampler's, one per completion
token) and optionally `env_mask` (1 = the model's token, trained; 0 = external, e.g. an
environment's reply), plus `completions` (what reward functions see; default: the decoded
text, as an assistant message for chat prompts). Every other key is a per-episode column that
reaches the reward functions as a keyword argument, as in TRL. Differences from TRL: the function
gets the model and tokenizer instead of the trainer, and seeds for reproducible sampling.

A function that also takes `generate` gets the run's engine: generate(prompts, sampling=None,
seeds=None) -> rlvr.rollout.Generation samples (rendered prompt texts in, token ids and log-probs
out) wherever the run generates, its generation servers included (`rollout.servers`); the weight
version its episodes carry is the oldest any of its calls was answered with.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import torch

from rlvr.rollout.engines.protocols import SamplingParams
from rlvr.rollout.episodes import Episodes, pad_rows
from rlvr.rollout.sources.single_turn import as_completions
from rlvr.specs import resolve

REQUIRED = ("prompt_ids", "completion_ids", "logprobs")


def load_function(spec: str) -> Callable:
    """`path/to/file.py:function` or `module:function`."""
    return resolve(spec.strip(), setting="rollout.function", spec=spec)


class FunctionSource:
    """RolloutSource over a user's rollout function (see the module docstring for its contract)."""

    reward_columns = None  # its extra fields are known only once it has run

    def __init__(self, fn: Callable, engine, tokenizer, sampling: SamplingParams):
        self.fn, self.engine, self.model, self.tokenizer, self.sampling = fn, engine, engine.model, tokenizer, sampling
        params = inspect.signature(fn).parameters
        self.wants_generate = "generate" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        self._versions: list[int] = []

    @property
    def group_size(self) -> int:
        return self.sampling.n

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def generate(self, prompts: Sequence[str], sampling: SamplingParams | None = None, seeds: Sequence[int] | None = None):
        """What the function gets as `generate`: the run's engine, its weight versions noted."""
        gen = self.engine.generate(list(prompts), sampling or self.sampling, list(range(len(prompts))) if seeds is None else seeds)
        if gen.versions is not None and len(gen.versions):
            self._versions.append(int(gen.versions.min()))
        return gen

    def metrics(self, episodes: Episodes) -> dict[str, float]:
        return {}

    def rollout(self, rows: list[dict], seeds: list[int]) -> Episodes:
        G, prompts = self.group_size, [r["prompt"] for r in rows]
        self._versions = []
        extra = {"generate": self.generate} if self.wants_generate else {}
        out = self.fn(prompts, model=self.model, tokenizer=self.tokenizer, sampling=self.sampling, seeds=list(seeds), **extra)
        N = len(rows) * G
        if missing := [k for k in REQUIRED if k not in out]:
            raise ValueError(f"rollout.function must return {list(REQUIRED)}; missing {missing}")
        for key in (*REQUIRED, *(["env_mask"] if "env_mask" in out else [])):
            if len(out[key]) != N:
                raise ValueError(f"rollout.function returned {len(out[key])} `{key}` for {len(rows)} prompts x {G} = {N} episodes")
        comp, lps = out["completion_ids"], out["logprobs"]
        mask = out.get("env_mask") or [[1] * len(c) for c in comp]
        for i, (c, lp, m) in enumerate(zip(comp, lps, mask)):
            if not len(c) == len(lp) == len(m):
                raise ValueError(f"rollout.function: episode {i} has {len(c)} completion ids, {len(lp)} logprobs, {len(m)} env_mask values")
        pad = self.tokenizer.pad_token_id
        prompt_ids, prompt_mask = pad_rows(out["prompt_ids"], pad, left=True)
        ids, attn = pad_rows(comp, pad, min_width=1)
        loss, _ = pad_rows(mask, 0, min_width=1)
        logp, _ = pad_rows(lps, 0.0, min_width=1, dtype=torch.float32)
        texts = self.tokenizer.batch_decode(ids.masked_fill(attn == 0, pad), skip_special_tokens=True)
        completions = out.get("completions") or as_completions([p for p in prompts for _ in range(G)], texts)
        truncated = torch.tensor([len(c) >= self.sampling.max_new_tokens and (not c or c[-1] != self.tokenizer.eos_token_id) for c in comp])
        columns = {k: list(v) for k, v in out.items() if k not in (*REQUIRED, "env_mask", "completions")}
        return Episodes(
            prompt_ids,
            prompt_mask,
            ids,
            attn,
            loss,
            logp,
            truncated,
            torch.arange(len(rows)).repeat_interleave(G),
            G,
            completions,
            texts,
            columns=columns,
            versions=torch.full((len(rows) * G,), min(self._versions)) if self._versions else None,
        )
