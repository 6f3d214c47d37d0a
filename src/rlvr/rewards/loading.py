"""Loading reward functions by name: built-in names, `module:function`, `file.py:function`, factories with parameters."""

from __future__ import annotations

from typing import Callable

from rlvr.rewards.factory import is_factory
from rlvr.specs import resolve, split_params


class RewardError(ValueError):
    """A reward function is missing, or returned something unusable; the message names it."""


BUILTIN = {  # the general rewards; the built-in tasks' verifiers (arithmetic, final_answer, guessed) are rlvr.tasks.REWARDS
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


def builtin_rewards() -> dict[str, str]:
    """Every built-in reward name -> `module:function`: the built-in tasks' verifiers and BUILTIN."""
    from rlvr.tasks import REWARDS  # here, not above: the task modules import rlvr.rewards.text

    return {**REWARDS, **BUILTIN}


def load_reward_fn(spec: str) -> Callable:
    """Resolve a config `fn` string to a reward function (calling factories with their params)."""
    name, params = split_params(spec, setting="reward", error=RewardError)
    builtins = builtin_rewards()
    fn = resolve(builtins.get(name, name), setting="reward", spec=spec, builtins=builtins, error=RewardError)
    if params or is_factory(fn):
        if not is_factory(fn) and params:
            raise RewardError(f"reward {spec!r}: {name} takes no parameters (it is not a reward factory)")
        try:
            fn = fn(**params)
        except (TypeError, ValueError, ImportError) as e:
            raise RewardError(f"reward {spec!r}: {e}") from None
    return fn
