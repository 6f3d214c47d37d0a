"""Where tool calls run: daemon worker threads for sync tools, one event loop for async ones.

`concurrent.futures.ThreadPoolExecutor` does not fit: its threads are joined at interpreter
exit, so one tool that never returns would hang the process, and it would hold a worker slot
forever. Here a job still running at its deadline is abandoned: its worker stops counting
against `max_workers` (a replacement may start) and exits whenever the job finally returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import deque
from typing import Callable

IDLE_EXIT_S = 60.0  # an idle worker exits after this long; a new one starts on demand


class _Job:
    __slots__ = ("fn", "deadline", "abandoned")

    def __init__(self, fn: Callable[[], None], deadline: float):
        self.fn, self.deadline, self.abandoned = fn, deadline, False


class DaemonPool:
    """At most `max_workers` jobs run at once, not counting abandoned ones; a job whose deadline
    passes while it waits in the queue is dropped (its caller has reported a timeout)."""

    def __init__(self, max_workers: int = 32):
        self.max_workers = max(1, int(max_workers))
        self.abandoned = 0
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._running: set[_Job] = set()
        self._workers = 0  # live workers that count against the cap
        self._idle = 0
        self._closed = False

    def submit(self, fn: Callable[[], None], deadline: float) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the tool runner is closed")
            self._sweep_locked()
            self._queue.append(_Job(fn, deadline))
            self._start_workers_locked()
            self._cond.notify()

    def grow(self, max_workers: int) -> None:
        """Raise the cap to `max_workers` (never lowers it); queued jobs start at once."""
        with self._cond:
            self.max_workers = max(self.max_workers, int(max_workers))
            self._start_workers_locked()

    def sweep(self) -> None:
        """Abandon running jobs past their deadline, starting replacements for queued work."""
        with self._cond:
            self._sweep_locked()
            self._start_workers_locked()

    def _sweep_locked(self) -> None:
        now = time.monotonic()
        for job in [j for j in self._running if j.deadline <= now]:
            job.abandoned = True
            self._running.discard(job)
            self._workers -= 1
            self.abandoned += 1

    def _start_workers_locked(self) -> None:
        # Queued jobs beyond the idle workers each get a new worker, up to the cap.
        while len(self._queue) > self._idle and self._workers < self.max_workers:
            self._workers += 1
            self._idle += 1  # counted idle until it takes a job, so the loop above terminates
            threading.Thread(target=self._work, name="rlvr-tool", daemon=True).start()

    def _work(self) -> None:
        idle_counted = True
        while True:
            with self._cond:
                while not self._queue:
                    if self._closed:
                        self._idle -= idle_counted
                        self._workers -= 1
                        return
                    if not idle_counted:
                        self._idle += 1
                        idle_counted = True
                    if not self._cond.wait(IDLE_EXIT_S) and not self._queue:
                        self._idle -= 1
                        self._workers -= 1
                        return
                job = self._queue.popleft()
                self._idle -= idle_counted
                idle_counted = False
                if job.deadline <= time.monotonic():
                    continue
                self._running.add(job)
            try:
                job.fn()
            except BaseException:  # the job reports its own errors; the worker must survive
                pass
            with self._cond:
                self._running.discard(job)
                if job.abandoned:
                    return  # a replacement already took this worker's place

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class LoopThread:
    """One asyncio event loop in a daemon thread, for every async tool call of a runner."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="rlvr-tools-async", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def _stop(self) -> None:
        for task in asyncio.all_tasks(self.loop):
            task.cancel()  # calls still running past their deadline
        self.loop.stop()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop)
        self._thread.join(timeout=1.0)
        if not self._thread.is_alive():
            self.loop.close()
