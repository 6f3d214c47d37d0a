"""What a built-in task is: training rows by index, held-out rows, and the reward that verifies them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# The tag format's result tags (tools.result_tags' default): the tool tasks' verifiers read episodes written with them.
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"


@dataclass(frozen=True)
class TaskOptions:
    """The data.* settings a task is built with; each task reads those that apply to it."""

    seed: int = 0  # the run's seed: which training rows it draws
    digits: int = 2  # data.digits (arithmetic)
    operators: str = "+-"  # data.operators (arithmetic)
    eval_size: int = 500  # data.eval_size: the held-out set's size


@dataclass
class Task:
    """A built-in task: endless training rows, a held-out set, and the reward that verifies it."""

    name: str
    train_row: Callable[[int], dict] | None  # index -> row, random access for exact resume; None: evaluation only
    eval_rows: Callable[[], list[dict]]
    reward: str  # built-in reward name that scores this task's answers (0 or 1)
    max_new_tokens: int = 8  # what a held-out answer needs (rlvr eval's default)
    # the tools.* settings the task is played with (`rlvr eval --task` uses them where nothing else sets tools)
    tools: dict = field(default_factory=dict)
