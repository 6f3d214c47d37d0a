"""The model work of `rlvr serve` on one thread: the one that calls `run()`, the process's main thread.

The HTTP server answers each connection on a new thread. On a GPU (an H200, torch 2.11) the hf engine
generated a batch 8x slower from a new thread than from the main thread of the same process (a thread kept
for many batches was as fast as the main one: the cost is each new thread's first CUDA work,
bench/results/gpu_server_overhead.md), so the handlers hand generation and weight swaps to the main
thread and wait for the answer; weights still arrive on the handler's thread, beside a generation.
A backend used in-process (tests, benches) does its work on the caller's thread (InlineWork).
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from concurrent.futures import Future
from typing import Callable, TypeVar

T = TypeVar("T")


class ServerStopping(RuntimeError):
    """The loop ended (the server is shutting down) before this work ran."""


class InlineWork:
    """Work on the caller's thread, at once: a backend used in-process (tests, benches)."""

    def call(self, fn: Callable[[], T]) -> T:
        return fn()

    def post(self, fn: Callable[[], object]) -> None:
        fn()


class MainThreadWork:
    """Work handed over from any thread, done in order by the thread in `run()`; until it runs, work waits."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future | None, Callable[[], object]]] = queue.SimpleQueue()
        self._owner: int | None = None  # the thread in run(), while it runs
        self._ended = False

    def call(self, fn: Callable[[], T]) -> T:
        """fn() on the loop's thread; its result, or its exception raised here."""
        if self._owner == threading.get_ident():
            return fn()
        done: Future = Future()
        self._put(done, fn)
        return done.result()

    def post(self, fn: Callable[[], object]) -> None:
        """fn() on the loop's thread, after the work handed over before it; not waited for (errors are printed)."""
        if self._owner == threading.get_ident():
            fn()
        else:
            self._put(None, fn)

    def _put(self, done: Future | None, fn: Callable[[], object]) -> None:
        if self._ended:
            raise ServerStopping("the server is stopping")
        self._jobs.put((done, fn))

    def run(self, stop: threading.Event | None = None, poll_s: float = 0.2) -> None:
        """Do the work handed over, in order, until `stop` is set or KeyboardInterrupt (SIGTERM in `rlvr serve`)
        ends it; work still waiting then, or handed over later, fails with ServerStopping: no caller waits forever."""
        stop = stop or threading.Event()
        self._owner = threading.get_ident()
        try:
            while not stop.is_set():
                try:
                    done, fn = self._jobs.get(timeout=poll_s)
                except queue.Empty:
                    continue
                _do(done, fn)
        finally:
            self._owner, self._ended = None, True
            while True:
                try:
                    done, _ = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if done is not None:
                    done.set_exception(ServerStopping("the server is stopping"))


def _do(done: Future | None, fn: Callable[[], object]) -> None:
    try:
        result = fn()
    except Exception as e:
        if done is None:
            print(f"rlvr serve: {type(e).__name__}: {e}", file=sys.stderr)
            traceback.print_exc()
        else:
            done.set_exception(e)
    except BaseException:  # KeyboardInterrupt: the loop ends; this caller is told why
        if done is not None:
            done.set_exception(ServerStopping("the server is stopping"))
        raise
    else:
        if done is not None:
            done.set_result(result)
