"""Reward functions: TRL's signature, loaded by name, run together with weights.

A reward function is `fn(prompts, completions, **columns) -> list[float | None]`: dataset
columns arrive as keyword arguments (plus `completion_ids`), and None means "not applicable
to this sample". Functions are named in config as a built-in name, `module:function`, or
`path/to/file.py:function`. Reward *factories* (built-in: math, code, code_lint, overlong,
length, test_writing, judge) take parameters in the name, as Python literals:
`fn: "overlong(max_length=512, buffer=128)"`; a bare factory name uses its defaults.

`RewardRunner` runs the functions concurrently (threads; async functions awaited together)
and isolates failures: a function that raises, times out, or returns the wrong count or a
non-number gives None for the affected samples (or 0.0 with `on_error="zero"`), is counted in
`last_errors[name]` (the trainer logs `rewards/<name>/errors`), has its first traceback
logged once, and training goes on.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import importlib.util
import inspect
import logging
import math
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from rlvr.rewards.factory import is_factory

log = logging.getLogger("rlvr.rewards")

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
DEFAULT_TIMEOUT_S = 300.0  # per function per batch; generous: code graders run whole test suites


class RewardError(ValueError):
    """A reward function is missing, or returned something unusable; the message names it."""


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
        raise RewardError(f"reward {spec!r}: use a built-in name ({', '.join(sorted(BUILTIN))}), module:function or file.py:function")
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
        raise RewardError(f"reward {spec!r}: {where} has no function {name!r}")
    return fn


def _accepts(fn: Callable) -> tuple[bool, set[str]]:
    params = inspect.signature(fn).parameters.values()
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    return var_kw, {p.name for p in params}


@dataclass
class RewardFn:
    name: str
    fn: Callable
    weight: float


class RewardRunner:
    """Calls every reward function on a batch and returns a [N, K] tensor (NaN where None).

    timeout_s: per function and batch; max_workers: threads for sync functions (default: one
    per function); on_error: "none" (NaN, i.e. not applicable) or "zero" for failed samples.
    """

    def __init__(self, fns: Sequence[RewardFn], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_workers: int | None = None, on_error: str = "none"):
        names = [f.name for f in fns]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise RewardError(f"two reward functions share the name {sorted(dupes)}: set `name` on one of them")
        if on_error not in ("none", "zero"):
            raise RewardError(f"on_error must be 'none' or 'zero', got {on_error!r}")
        self.fns = list(fns)
        self.timeout_s = timeout_s
        self.on_error = on_error
        self.last_errors: dict[str, int] = {f.name: 0 for f in self.fns}
        self.total_errors: dict[str, int] = {f.name: 0 for f in self.fns}
        self._logged: set[str] = set()
        self.max_workers = max_workers or max(1, len(self.fns))

    @classmethod
    def from_config(cls, specs, **options) -> "RewardRunner":
        fns = []
        for s in specs:
            fn = load_reward_fn(s.fn)
            fns.append(RewardFn(s.name or getattr(fn, "__name__", s.fn), fn, s.weight))
        return cls(fns, **options)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fns]

    @property
    def weights(self) -> torch.Tensor:
        return torch.tensor([f.weight for f in self.fns], dtype=torch.float64)

    def _kwargs(self, rf: RewardFn, columns: dict, extra: dict) -> dict:
        var_kw, names = _accepts(rf.fn)
        kwargs = {**columns, **extra}
        return kwargs if var_kw else {k: v for k, v in kwargs.items() if k in names}

    def __call__(self, prompts: list, completions: list, columns: dict[str, list], **extra) -> torch.Tensor:
        n = len(completions)
        self.last_errors = {f.name: 0 for f in self.fns}
        deadline = time.monotonic() + self.timeout_s
        sync = [(k, rf) for k, rf in enumerate(self.fns) if not _is_async(rf.fn)]
        asyncs = [(k, rf) for k, rf in enumerate(self.fns) if _is_async(rf.fn)]
        outcomes: dict[int, tuple[object, BaseException | None]] = {}
        gate = threading.BoundedSemaphore(self.max_workers)
        threads = []
        for k, rf in sync:
            kwargs = self._kwargs(rf, columns, extra)
            # Daemon threads: a function that hangs past its timeout is abandoned (Python cannot
            # kill a thread) and must not block the interpreter's exit either.
            t = threading.Thread(target=self._call, args=(gate, k, rf.fn, prompts, completions, kwargs, outcomes),
                                 name=f"rlvr-reward-{rf.name}", daemon=True)
            t.start()
            threads.append((k, t))
        if asyncs:
            outcomes.update(self._run_async(asyncs, prompts, completions, columns, extra))
        for k, t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                outcomes[k] = (None, TimeoutError(f"took longer than {self.timeout_s} s"))
        out = torch.empty((n, len(self.fns)), dtype=torch.float64)
        for k, rf in enumerate(self.fns):
            values, error = outcomes[k]
            out[:, k] = torch.tensor(self._clean(rf.name, values, error, n), dtype=torch.float64)
        return out

    @staticmethod
    def _call(gate, k, fn, prompts, completions, kwargs, outcomes) -> None:
        with gate:
            try:
                result = (fn(prompts=prompts, completions=completions, **kwargs), None)
            except Exception as e:
                result = (None, e)
        outcomes.setdefault(k, result)  # a late result after a timeout is dropped

    def _run_async(self, asyncs, prompts, completions, columns, extra) -> dict:
        """Await every async reward function together, in a private event loop."""
        async def one(rf):
            return await asyncio.wait_for(
                rf.fn(prompts=prompts, completions=completions, **self._kwargs(rf, columns, extra)), self.timeout_s)

        async def gather():
            return await asyncio.gather(*(one(rf) for _, rf in asyncs), return_exceptions=True)

        results: list = []
        runner = threading.Thread(target=lambda: results.extend(asyncio.run(gather())), name="rlvr-reward-async")
        runner.start()  # own thread: the caller may itself be inside a running event loop
        runner.join()
        out = {}
        for (k, _), r in zip(asyncs, results):
            if isinstance(r, asyncio.TimeoutError):
                r = TimeoutError(f"took longer than {self.timeout_s} s")
            out[k] = (None, r) if isinstance(r, BaseException) else (r, None)
        return out

    def _fail(self, name: str, count: int, message: str, error: BaseException | None = None) -> None:
        self.last_errors[name] += count
        self.total_errors[name] += count
        if name not in self._logged:
            self._logged.add(name)
            detail = "\n" + "".join(traceback.format_exception(error)) if error is not None else ""
            log.warning("reward function %r failed (further failures are only counted in rewards/%s/errors): %s%s",
                        name, name, message, detail)

    def _clean(self, name: str, values, error: BaseException | None, n: int) -> list[float]:
        """Validated rewards; failed samples become NaN (or 0.0) and are counted."""
        bad = 0.0 if self.on_error == "zero" else math.nan
        if error is not None:
            self._fail(name, n, f"{type(error).__name__}: {error}", error)
            return [bad] * n
        if not isinstance(values, (list, tuple)):
            self._fail(name, n, f"must return a list of {n} numbers, got {type(values).__name__}")
            return [bad] * n
        if len(values) != n:
            self._fail(name, n, f"returned {len(values)} values for {n} completions")
            return [bad] * n
        clean = []
        for i, v in enumerate(values):
            if v is None:
                clean.append(math.nan)
                continue
            f = None
            if isinstance(v, (int, float)):
                f = float(v)
            elif hasattr(v, "item"):  # numpy / torch scalars
                try:
                    f = float(v.item())
                except (TypeError, ValueError, RuntimeError):
                    pass
            if f is None or math.isnan(f) or math.isinf(f):
                self._fail(name, 1, f"returned {v!r} ({type(v).__name__}) for completion {i}; expected a finite number or None")
                clean.append(bad)
            else:
                clean.append(f)
        return clean


def _is_async(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004 (the method itself)
