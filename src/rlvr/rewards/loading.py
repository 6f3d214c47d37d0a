"""Loading reward functions by name: built-in names, `module:function`, `file.py:function`, factories with parameters."""

from __future__ import annotations

from typing import Callable

from rlvr.rewards.factory import is_factory
from rlvr.specs import resolve, split_params


class RewardError(ValueError):
    """A reward function is missing, or returned something unusable; the message names it."""


BUILTIN = {
    "arithmetic": "rlvr.rewards.builtin:arithmetic_correct",
    "final_answer": "rlvr.rewards.builtin:final_answer",
    "guessed": "rlvr.rewards.builtin:guessed",
    "math": "rlvr.rewards.math_answer:math",
    "format": "rlvr.rewards.formatting:format_lenient",
    "format_strict": "rlvr.rewards.formatting:format_strict",
    "format_lenient": "rlvr.rewards.formatting:format_lenient",
    "format_partial": "rlvr.rewards.formatting:format_partial",
    "code": "rlvr.rewards.code_exec:code",
    "code_compiles": "rlvr.rewards.code_exec:code_compiles",
    "code_lint": "rlvr.rewards.code_exec:code_lint",
    "test_writing": "rlvr.rewards.writing_tests:test_writing",
    "overlong": "rlvr.rewards.length:overlong",
    "length": "rlvr.rewards.length:length_penalty",
    "judge": "rlvr.rewards.judge:judge",
}


def load_reward_fn(spec: str) -> Callable:
    """Resolve a config `fn` string to a reward function (calling factories with their params)."""
    name, params = split_params(spec, setting="reward", error=RewardError)
    fn = resolve(BUILTIN.get(name, name), setting="reward", spec=spec, builtins=BUILTIN, error=RewardError)
    if params or is_factory(fn):
        if not is_factory(fn) and params:
            raise RewardError(f"reward {spec!r}: {name} takes no parameters (it is not a reward factory)")
        try:
            fn = fn(**params)
        except (TypeError, ValueError, ImportError) as e:
            raise RewardError(f"reward {spec!r}: {e}") from None
    return fn
