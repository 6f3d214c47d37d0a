"""Loading reward functions by name: built-in names, `module:function`, `file.py:function`, factories with parameters."""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable

from rlvr.rewards.factory import is_factory


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


def _split_params(spec: str) -> tuple[str, dict]:
    """`name(a=1, b='x')` -> ("name", {"a": 1, "b": "x"}); literals only, nothing is evaluated."""
    spec = spec.strip()
    if not spec.endswith(")") or "(" not in spec:
        return spec, {}
    head = spec[: spec.index("(")]
    try:
        call = ast.parse("f" + spec[len(head):], mode="eval").body
        if not isinstance(call, ast.Call) or call.args:
            raise ValueError("use keyword arguments")
        return head.strip(), {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError) as e:
        raise RewardError(f"reward {spec!r}: parameters must be keyword=literal pairs ({e})") from None


def load_reward_fn(spec: str) -> Callable:
    """Resolve a config `fn` string to a reward function (calling factories with their params)."""
    name, params = _split_params(spec)
    fn = _resolve(spec, BUILTIN.get(name, name))
    if params or is_factory(fn):
        if not is_factory(fn) and params:
            raise RewardError(f"reward {spec!r}: {name} takes no parameters (it is not a reward factory)")
        try:
            fn = fn(**params)
        except (TypeError, ValueError, ImportError) as e:
            raise RewardError(f"reward {spec!r}: {e}") from None
    return fn


def _resolve(spec: str, target: str) -> Callable:
    if ":" not in target:
        raise RewardError(f"reward {spec!r}: use a built-in name ({', '.join(sorted(BUILTIN))}), module:function or file.py:function"
                          + _did_you_mean(target, BUILTIN))
    where, name = target.rsplit(":", 1)
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise RewardError(f"reward {spec!r}: file not found: {path}")
        mod_name = f"rlvr_user_rewards_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise RewardError(f"reward {spec!r}: cannot import module {where!r}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        public = [n for n, v in vars(module).items() if not n.startswith("_") and callable(v)]
        raise RewardError(f"reward {spec!r}: {where} has no function {name!r}" + _did_you_mean(name, public))
    return fn


def _did_you_mean(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


