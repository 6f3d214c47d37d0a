"""Reward functions shared by both libraries in bench/compare_trl.py (TRL's signature).

Each records the completion lengths it sees, so the benchmark can check that both libraries
generated exactly the same number of tokens.
"""

from __future__ import annotations

SEEN_LENGTHS: list[int] = []


def _text(c) -> str:
    return c[-1]["content"] if isinstance(c, list) else c


def _record(completion_ids):
    if completion_ids is not None:
        SEEN_LENGTHS.extend(len(ids) for ids in completion_ids)


def arithmetic(prompts, completions, answer, completion_ids=None, **kwargs) -> list[float]:
    """1 when the completion's first number is the answer (the bundled task's grader)."""
    from rlvr.tasks.arithmetic import is_correct

    _record(completion_ids)
    return [float(is_correct(_text(c), a)) for c, a in zip(completions, answer)]


def digit_share(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
    """Share of digit characters: a continuous score that varies inside every group, even for
    a randomly initialised model (so every group carries signal)."""
    _record(completion_ids)
    return [sum(ch.isdigit() for ch in _text(c)) / max(len(_text(c)), 1) for c in completions]
