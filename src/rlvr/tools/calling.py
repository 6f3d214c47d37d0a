"""Running tool calls: bind the arguments, call with a deadline, turn the outcome into text.

Every failure (unknown tool, bad arguments, the tool raised, ran past its timeout, returned
something that is not text) becomes a `ToolResult` with ok=False whose `text` is the short
message the model sees; nothing here raises because of what a tool or the model did.

`ToolRunner.submit` returns at once. Sync tools run on daemon threads (a hung one cannot be
killed, so it is abandoned at its deadline: it neither blocks later calls nor interpreter exit);
async tools run on one long-lived event loop in a background thread and are cancelled at their
deadline. `PendingCall.result()` never blocks past submit time + timeout_s.
"""

from __future__ import annotations

import asyncio
import json
import numbers
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from rlvr.tools.binding import BindError, bind
from rlvr.tools.pool import DaemonPool, LoopThread
from rlvr.tools.registry import Tool

UNKNOWN_TOOL, BAD_ARGUMENTS, RAISED, TIMEOUT, NOT_A_STRING = ("unknown_tool", "bad_arguments", "raised", "timeout", "not_a_string")
ERRORS = (UNKNOWN_TOOL, BAD_ARGUMENTS, RAISED, TIMEOUT, NOT_A_STRING)


@dataclass
class ToolCall:
    """One call the model made. `arguments`: a dict (JSON formats) or the raw text between tags.
    `error` is set when the call could not be parsed; it is then reported as bad_arguments."""

    name: str
    arguments: dict | str
    raw: str
    error: str | None = None


@dataclass
class ToolResult:
    name: str
    text: str  # what the model sees, error messages included
    ok: bool
    error: str | None = None  # one of ERRORS, or None
    seconds: float = 0.0


def to_text(value: Any) -> str | None:
    """A tool's return value as text, or None when it has no faithful text form."""
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Number):  # bool, int, float, numpy scalars
        return str(value)
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            return None
    return None


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, (dict, list, tuple)):
        return f"a {type(value).__name__} that is not JSON-serialisable"
    return f"a value of type {type(value).__name__}"


def cap(text: str, limit: int) -> str:
    """Cut to `limit` characters with a visible marker (not an error: the model sees the start)."""
    return text if len(text) <= limit else f"{text[:limit]}...[truncated {len(text) - limit} chars]"


class PendingCall:
    """A submitted call. done(): finished or past its deadline; result(): never blocks past it."""

    def __init__(self, call: ToolCall, runner: "ToolRunner"):
        self.call = call
        self.submitted = time.monotonic()
        self.deadline = self.submitted + runner.timeout_s
        self._runner = runner
        self._result: ToolResult | None = None
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._cancel: Callable[[], bool] | None = None  # cancels the async task once the deadline has passed

    def set(self, result: ToolResult) -> None:
        """The first outcome wins: a result arriving after a timeout was reported is dropped."""
        with self._lock:
            if self._result is not None:
                return
            self._result = result
        self._event.set()
        self._runner.notify()

    def done(self) -> bool:
        return self._event.is_set() or time.monotonic() >= self.deadline

    def result(self) -> ToolResult:
        remaining = self.deadline - time.monotonic()
        if remaining > 0:
            self._event.wait(remaining)
        if not self._event.is_set():
            self.time_out()
        assert self._result is not None, "set by the call, or else by time_out()"
        return self._result

    def time_out(self) -> None:
        name = self.call.name
        self.set(
            ToolResult(
                name, f"error: {name} timed out after {float(self._runner.timeout_s)}s", False, TIMEOUT, time.monotonic() - self.submitted
            )
        )
        if self._cancel is not None:
            self._cancel()
        self._runner.sweep()


DEFAULT_WORKERS = 32


class ToolRunner:
    """Runs tool calls concurrently, each bounded by `timeout_s`; results capped at
    `max_result_chars`; at most `max_workers` sync calls run at once (abandoned ones excluded).
    max_workers=None: DEFAULT_WORKERS, raised by `expect` to the calls a batch may have pending."""

    def __init__(self, timeout_s: float = 10.0, max_result_chars: int = 1000, max_workers: int | None = None):
        self.timeout_s = float(timeout_s)
        self.max_result_chars = int(max_result_chars)
        self._sized_by_batch = max_workers is None
        self._pool = DaemonPool(DEFAULT_WORKERS if max_workers is None else max_workers)
        self._loop: LoopThread | None = None
        self._loop_lock = threading.Lock()
        self._cond = threading.Condition()

    @property
    def max_workers(self) -> int:
        return self._pool.max_workers

    def expect(self, calls: int) -> None:
        """Up to `calls` calls may be pending at once (e.g. one per episode of a batch). Unless
        max_workers was given, the pool grows so that they all run at once: a call that queues
        loses time from its timeout, and the episode waiting on it falls behind. Threads are
        started on demand and exit when idle; CPU-heavy tools are bounded by rlvr.sandbox's own gate."""
        if self._sized_by_batch:
            self._pool.grow(calls)

    @property
    def abandoned(self) -> int:
        """Sync calls left running past their deadline so far (their threads may still run)."""
        return self._pool.abandoned

    def notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def sweep(self) -> None:
        self._pool.sweep()

    def _fail(self, pending: PendingCall, error: str, text: str) -> None:
        pending.set(ToolResult(pending.call.name, cap(text, self.max_result_chars), False, error, time.monotonic() - pending.submitted))

    def _finish(self, pending: PendingCall, value: Any = None, exc: BaseException | None = None) -> None:
        name = pending.call.name
        if exc is not None:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return self._fail(pending, RAISED, f"error: {name} raised {detail}")
        text = to_text(value)
        if text is None:
            return self._fail(pending, NOT_A_STRING, f"error: {name} returned {_describe(value)}, not a string")
        pending.set(ToolResult(name, cap(text, self.max_result_chars), True, None, time.monotonic() - pending.submitted))

    def submit(self, call: ToolCall, tools: dict[str, Tool]) -> PendingCall:
        pending = PendingCall(call, self)
        if call.error is not None and not call.name:
            self._fail(pending, BAD_ARGUMENTS, f"error: could not read the tool call: {call.error}")
            return pending
        tool = tools.get(call.name)
        if tool is None:
            self._fail(pending, UNKNOWN_TOOL, f"error: tool {call.name!r} is not available; tools: {', '.join(tools) or 'none'}")
            return pending
        try:
            if call.error is not None:
                raise BindError(call.error)
            kwargs = bind(call.arguments, tool)
        except BindError as e:
            self._fail(pending, BAD_ARGUMENTS, f"error: bad arguments for {call.name}: {e}")
            return pending
        if tool.is_async:
            future = self._event_loop().submit(self._run_async(pending, tool, kwargs))
            pending._cancel = future.cancel
        else:
            self._pool.submit(lambda: self._run_sync(pending, tool, kwargs), pending.deadline)
        return pending

    def _run_sync(self, pending: PendingCall, tool: Tool, kwargs: dict) -> None:
        try:
            value = tool.fn(**kwargs)
        except BaseException as e:  # SystemExit from a tool must not end the worker silently
            return self._finish(pending, exc=e)
        self._finish(pending, value)

    async def _run_async(self, pending: PendingCall, tool: Tool, kwargs: dict) -> None:
        try:
            value = await asyncio.wait_for(tool.fn(**kwargs), max(0.0, pending.deadline - time.monotonic()))
        except asyncio.TimeoutError:
            pending.time_out()
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            self._finish(pending, exc=e)
        else:
            self._finish(pending, value)

    def _event_loop(self) -> LoopThread:
        with self._loop_lock:
            if self._loop is None:
                self._loop = LoopThread()
            return self._loop

    def wait_any(self, pending: list[PendingCall], timeout: float | None = None) -> list[PendingCall]:
        """Block until at least one call is done (finished or past its deadline) or `timeout`
        seconds pass; return the done ones (possibly none, on timeout)."""
        end = None if timeout is None else time.monotonic() + timeout
        self.sweep()
        with self._cond:
            while True:
                done = [p for p in pending if p.done()]
                if done or not pending:
                    return done
                now = time.monotonic()
                if end is not None and now >= end:
                    return []
                wake = min(p.deadline for p in pending)
                if end is not None:
                    wake = min(wake, end)
                self._cond.wait(max(0.0, wake - now))

    def run(self, calls: list[ToolCall], tools: dict[str, Tool]) -> list[ToolResult]:
        """Submit all, then collect in order (they run concurrently)."""
        pending = [self.submit(c, tools) for c in calls]
        return [p.result() for p in pending]

    def close(self) -> None:
        self._pool.close()
        with self._loop_lock:
            if self._loop is not None:
                self._loop.close()
                self._loop = None

    def __enter__(self) -> "ToolRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
