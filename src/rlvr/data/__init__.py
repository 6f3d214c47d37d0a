"""Prompt data: dataset files, served as a resumable stream of rows (the built-in tasks' rows are rlvr.tasks').

A row is a dict with a `prompt` (text or chat messages) and any other columns, which reach
reward functions as keyword arguments (TRL's convention).
"""

from __future__ import annotations

import random
from typing import Callable

from rlvr.data.loaders import load_rows


class PromptStream:
    """Rows in training order. `position` counts rows handed out: the whole resumable state.

    A finite dataset is walked epoch by epoch, each epoch in its own order drawn from the seed,
    so row number `position` is known without replaying the stream.
    """

    def __init__(self, row_at: Callable[[int], dict], size: int | None, *, seed: int = 0, shuffle: bool = True):
        self._row_at, self.size, self.seed, self.shuffle = row_at, size, seed, shuffle
        self.position = 0
        self._order_epoch, self._order = -1, list(range(size or 0))

    @classmethod
    def from_rows(cls, rows: list[dict], *, seed: int = 0, shuffle: bool = True) -> "PromptStream":
        return cls(rows.__getitem__, len(rows), seed=seed, shuffle=shuffle)

    def _row(self, i: int) -> dict:
        if self.size is None:
            return self._row_at(i)
        epoch, offset = divmod(i, self.size)
        if epoch != self._order_epoch:
            self._order = list(range(self.size))
            if self.shuffle:
                random.Random(f"{self.seed}:epoch{epoch}").shuffle(self._order)
            self._order_epoch = epoch
        return self._row_at(self._order[offset])

    def take(self, n: int) -> list[dict]:
        rows = [self._row(self.position + k) for k in range(n)]
        self.position += n
        return rows

    def rows_at(self, position: int, n: int) -> list[dict]:
        """The n rows from `position` on, without moving the stream."""
        return [self._row(position + k) for k in range(n)]

    def fork(self) -> "PromptStream":
        """The same rows in the same order, with its own position and epoch cache (to read ahead from another thread)."""
        other = PromptStream(self._row_at, self.size, seed=self.seed, shuffle=self.shuffle)
        other.position = self.position
        return other

    @property
    def epoch(self) -> float:
        return self.position / self.size if self.size else 0.0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])


def render_prompt(prompt, tokenizer, system_prompt: str | None = None) -> str:
    """Prompt text as the model sees it: chat template applied when the tokenizer has one."""
    messages = prompt_messages(prompt, system_prompt)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if isinstance(prompt, str) and not system_prompt:
        return prompt
    return "".join(f"{m['content']}\n" for m in messages)


def prompt_messages(prompt, system_prompt: str | None = None) -> list[dict]:
    """A row's prompt (text, or a list of {role, content} messages) as chat messages, the system prompt first
    unless the prompt has its own."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        messages = list(prompt)
    else:
        raise ValueError(f"a prompt must be text or a list of {{role, content}} messages, got {type(prompt).__name__}")
    if system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


__all__ = ["PromptStream", "load_rows", "prompt_messages", "render_prompt"]
