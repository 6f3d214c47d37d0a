"""Running reward functions on a batch: concurrently, bounded in time, with TRL's calling contract.

Each function is called as TRL 1.16's GRPOTrainer calls it: `fn(prompts=, completions=,
completion_ids=, **columns, trainer_state=, log_metric=, log_extra=)`; a function gets the
keywords it names (all of them when it takes **kwargs). `trainer_state` is a `TrainerState` (the
fields TRL reward functions read: `global_step`, `max_steps`, `epoch`, ...), `log_metric(name,
value)` adds a scalar to the step's metrics (the mean of the values logged in the step), and
`log_extra(column, values)` adds a column, one value per completion, to the completions table.

A function that raises, runs past `timeout_s`, or returns the wrong count or a non-number gives
None for the affected samples (or 0.0 with `on_error="zero"`), is counted (`last_errors`,
`total_errors`; the trainer logs `rewards/<name>/errors` and `.../error_rate`), has its first
traceback logged once and kept (`first_error`), and training goes on. A sync function past its
time is stopped: an exception is raised in its thread (Python cannot kill a thread; code blocked
outside Python stops when it returns there), and built-in graders hold their slow work in
processes they kill (`rlvr.rewards.symbolic`, `rlvr.sandbox`), so nothing keeps computing.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import logging
import math
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from rlvr.rewards.loading import RewardError, load_reward_fn

log = logging.getLogger("rlvr.rewards")
DEFAULT_TIMEOUT_S = 300.0  # per function per batch; generous: code graders run whole test suites
STOP_GRACE_S = 0.1  # how long a stopped function's thread may take to unwind (Python code: a few ms)


class RewardTimeout(BaseException):
    """Raised inside a reward function's thread when it runs past its time (BaseException, so that
    an `except Exception` in the function does not swallow it)."""


@dataclass
class TrainerState:
    """What TRL passes reward functions as `trainer_state` (transformers.TrainerState's fields that
    reward functions read, e.g. for curricula). The trainer updates it before every step."""

    global_step: int = 0  # optimizer steps done before this batch (0 while scoring the first)
    max_steps: int = 0  # steps the run will take
    epoch: float = 0.0  # passes over the prompt dataset so far (0 for generated tasks)
    num_input_tokens_seen: int = 0  # prompt and completion tokens trained on so far
    is_world_process_zero: bool = True  # this is rank 0
    is_local_process_zero: bool = True


@dataclass
class RewardFn:
    name: str
    fn: Callable
    weight: float


def _accepts(fn: Callable) -> tuple[bool, set[str]]:
    params = inspect.signature(fn).parameters.values()
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    return var_kw, {p.name for p in params}


class RewardRunner:
    """Calls every reward function on a batch and returns a [N, K] tensor (NaN where None).

    timeout_s: per function and batch; max_workers: threads for sync functions (default: one
    per function); on_error: "none" (NaN, i.e. not applicable) or "zero" for failed samples.
    """

    def __init__(
        self, fns: Sequence[RewardFn], *, timeout_s: float = DEFAULT_TIMEOUT_S, max_workers: int | None = None, on_error: str = "none"
    ):
        names = [f.name for f in fns]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise RewardError(f"two reward functions share the name {sorted(dupes)}: set `name` on one of them")
        if on_error not in ("none", "zero"):
            raise RewardError(f"on_error must be 'none' or 'zero', got {on_error!r}")
        self.fns = list(fns)
        self.timeout_s = timeout_s
        self.on_error = on_error
        self.state = TrainerState()
        self.last_errors: dict[str, int] = {f.name: 0 for f in self.fns}
        self.total_errors: dict[str, int] = {f.name: 0 for f in self.fns}
        self.total_scored = 0  # samples scored since the start (by every function)
        self.first_error: dict[str, str] = {}  # name -> its first failure, summarised
        self.last_logged_columns: dict[str, list] = {}  # log_extra of the last batch: column -> [N]
        self._logged_metrics: dict[str, list[float]] = {}  # log_metric since take_logged_metrics
        self._lock = threading.Lock()
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

    def take_logged_metrics(self) -> dict[str, list[float]]:
        """The values reward functions passed to log_metric since the last call, by name."""
        with self._lock:
            out, self._logged_metrics = self._logged_metrics, {}
        return out

    # ------------------------------------------------------------------ TRL's logging callables

    def _log_metric(self, name: str, value: float) -> None:
        with self._lock:
            self._logged_metrics.setdefault(str(name), []).append(float(value))

    def _log_extra_for(self, n: int) -> Callable:
        def log_extra(column: str, values: list) -> None:
            values = list(values)
            if len(values) != n:
                raise ValueError(f"log_extra({column!r}, values): {len(values)} values for {n} completions (one per completion)")
            with self._lock:
                self.last_logged_columns[str(column)] = values

        return log_extra

    def _kwargs(self, rf: RewardFn, columns: dict, extra: dict) -> dict:
        var_kw, names = _accepts(rf.fn)
        kwargs = {**columns, **extra}
        return kwargs if var_kw else {k: v for k, v in kwargs.items() if k in names}

    # ------------------------------------------------------------------ one batch

    def __call__(self, prompts: list, completions: list, columns: dict[str, list], **extra) -> torch.Tensor:
        n = len(completions)
        self.last_errors = {f.name: 0 for f in self.fns}
        self.last_logged_columns = {}
        self.total_scored += n
        extra = {**extra, "trainer_state": self.state, "log_metric": self._log_metric, "log_extra": self._log_extra_for(n)}
        deadline = time.monotonic() + self.timeout_s
        sync = [(k, rf) for k, rf in enumerate(self.fns) if not _is_async(rf.fn)]
        asyncs = [(k, rf) for k, rf in enumerate(self.fns) if _is_async(rf.fn)]
        outcomes: dict[int, tuple[object, BaseException | None]] = {}
        gate = threading.BoundedSemaphore(self.max_workers)
        threads = []
        for k, rf in sync:
            kwargs = self._kwargs(rf, columns, extra)
            # Daemon threads: one that cannot be stopped (blocked outside Python) must not block the interpreter's exit.
            t = threading.Thread(
                target=self._call, args=(gate, k, rf.fn, prompts, completions, kwargs, outcomes), name=f"rlvr-reward-{rf.name}", daemon=True
            )
            t.start()
            threads.append((k, t))
        if asyncs:
            outcomes.update(self._run_async(asyncs, prompts, completions, columns, extra))
        for k, t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                outcomes.setdefault(k, (None, TimeoutError(f"took longer than {self.timeout_s} s")))
                _stop(t, self.fns[k].name)
        out = torch.empty((n, len(self.fns)), dtype=torch.float64)
        for k, rf in enumerate(self.fns):
            values, error = outcomes[k]
            out[:, k] = torch.tensor(self._clean(rf.name, values, error, n), dtype=torch.float64)
        return out

    @staticmethod
    def _call(gate, k, fn, prompts, completions, kwargs, outcomes) -> None:
        result: tuple[Any, Exception | None]
        try:
            with gate:
                result = (fn(prompts=prompts, completions=completions, **kwargs), None)
        except RewardTimeout:
            return  # stopped past its time: the timeout is already recorded
        except Exception as e:
            result = (None, e)
        outcomes.setdefault(k, result)  # a late result after a timeout is dropped

    def _run_async(self, asyncs, prompts, completions, columns, extra) -> dict:
        """Await every async reward function together, in a private event loop."""

        async def one(rf):
            return await asyncio.wait_for(
                rf.fn(prompts=prompts, completions=completions, **self._kwargs(rf, columns, extra)), self.timeout_s
            )

        async def gather():
            return await asyncio.gather(*(one(rf) for _, rf in asyncs), return_exceptions=True)

        results: list = []

        def run():
            try:
                results.extend(asyncio.run(gather()))
            except RewardTimeout:
                pass

        runner = threading.Thread(target=run, name="rlvr-reward-async", daemon=True)
        runner.start()  # own thread: the caller may itself be inside a running event loop
        runner.join(self.timeout_s + STOP_GRACE_S)  # wait_for cannot fire while a function blocks the loop
        if runner.is_alive():
            _stop(runner, "async reward functions")
        out = {}
        for i, (k, _) in enumerate(asyncs):
            r = results[i] if i < len(results) else TimeoutError(f"took longer than {self.timeout_s} s (blocked its event loop)")
            if isinstance(r, asyncio.TimeoutError):
                r = TimeoutError(f"took longer than {self.timeout_s} s")
            out[k] = (None, r) if isinstance(r, BaseException) else (r, None)
        return out

    # ------------------------------------------------------------------ failures

    def _fail(self, name: str, count: int, message: str, error: BaseException | None = None) -> None:
        self.last_errors[name] += count
        self.total_errors[name] += count
        if name not in self.first_error:
            self.first_error[name] = _summary(message, error)
            detail = "\n" + "".join(traceback.format_exception(error)) if error is not None else ""
            log.warning(
                "reward function %r failed (further failures are only counted in rewards/%s/errors): %s%s", name, name, message, detail
            )

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


def _summary(message: str, error: BaseException | None) -> str:
    """`ValueError: grader bug (at my_rewards.py:12 in score)`: the message and where it was raised."""
    if error is None or error.__traceback__ is None:
        return message
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename != __file__] or traceback.extract_tb(error.__traceback__)
    frame = frames[-1]  # the deepest frame outside the runner (log_extra raises from here)
    return f"{message} (at {frame.filename}:{frame.lineno} in {frame.name})"


def _stop(thread: threading.Thread, what: str) -> None:
    """Raise RewardTimeout inside a thread past its time, and wait briefly for it to unwind."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(RewardTimeout))
    thread.join(STOP_GRACE_S)
    if thread.is_alive():
        log.warning("reward function %s is still running past its time (blocked outside Python); it stops when it returns to Python", what)


def _is_async(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004 (the method itself)
