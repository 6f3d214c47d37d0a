"""Symbolic equality through math-verify, each comparison bounded in time, from any thread.

    >>> POOL.equal_many([("x^2+2x+1", "(x+1)^2"), ("9^{9^{9}}", "1")], timeout_s=2.0)  # doctest: +SKIP
    [True, False]

math-verify's own time limits use `signal.alarm`, which works only on the main thread (training
grades in worker threads), so they are off and every comparison runs instead in a worker process
of a small pool (`python _symbolic_worker.py`: a fresh interpreter, never a fork of the trainer).
A comparison still running at its limit gets its worker killed (SIGKILL, then reaped) and counts
as "not equal"; a new worker starts when one is next needed. If the calling thread is interrupted
(the reward runner stops a function past its time), the workers it was waiting on are killed too,
so nothing keeps computing. Idle workers exit by themselves after `idle_exit_s`, and at exit.
"""

from __future__ import annotations

import atexit
import collections
import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

AVAILABLE = importlib.util.find_spec("math_verify") is not None
DEFAULT_TIMEOUT_S = 3.0
_WORKER = str(Path(__file__).with_name("_symbolic_worker.py"))


class _Worker:
    """One worker process and its half-read output."""

    def __init__(self, idle_exit_s: float, memory_mb: int):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, _WORKER, str(idle_exit_s), str(memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            close_fds=True,
        )
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None, "opened with stdin=PIPE, stdout=PIPE"
        self.stdin, self.stdout = stdin, stdout
        self.fd = stdout.fileno()
        self.buffer, self.ready, self.started = b"", False, time.monotonic()

    def send(self, gold: str, answer: str, limit_s: float) -> None:
        self.stdin.write(json.dumps({"gold": gold, "answer": answer, "limit_s": limit_s}).encode() + b"\n")
        self.stdin.flush()

    def replies(self) -> list[dict] | None:
        """The complete lines that arrived; None when the process ended."""
        data = os.read(self.fd, 1 << 16)
        if not data:
            return None
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.stdin, self.stdout, self.stderr):
            try:
                f.close()
            except OSError:  # a broken pipe to a killed worker
                pass

    def startup_error(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-2000:]


class SymbolicPool:
    """Up to `size` math-verify worker processes; `equal_many` spreads comparisons over them."""

    def __init__(self, size: int, *, idle_exit_s: float = 120.0, memory_mb: int = 4096, startup_timeout_s: float = 120.0):
        self.size, self.idle_exit_s, self.memory_mb, self.startup_timeout_s = size, idle_exit_s, memory_mb, startup_timeout_s
        self.workers: list[_Worker] = []
        self.timeouts = 0  # comparisons stopped at their limit, since the start
        self._lock = threading.Lock()
        _POOLS.add(self)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers if w.alive()]

    def equal_many(self, pairs: list[tuple[str, str]], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[bool]:
        """[math-verify's verify(parse(gold), parse(answer))] for (gold, answer) pairs, each within
        timeout_s seconds (False when it runs longer or fails)."""
        with self._lock:
            return self._run(pairs, timeout_s)

    def _run(self, pairs: list[tuple[str, str]], timeout_s: float) -> list[bool]:
        results = [False] * len(pairs)
        todo = collections.deque(range(len(pairs)))
        busy: dict[_Worker, tuple[int, float]] = {}
        try:
            while todo or busy:
                self._staff(len(todo) + len(busy))
                for w in self.workers:
                    if todo and w.ready and w not in busy:
                        i = todo[0]
                        try:
                            w.send(*pairs[i], timeout_s)
                        except OSError:  # it exited while idle: replaced next round
                            self._drop(w)
                            continue
                        busy[w] = (todo.popleft(), time.monotonic() + timeout_s)
                waiting = [w for w in self.workers if w in busy or not w.ready]
                if not waiting:  # a worker was replaced before it took its comparison
                    continue
                deadline = min([d for _, d in busy.values()] + [w.started + self.startup_timeout_s for w in waiting if not w.ready])
                readable, _, _ = select.select([w.fd for w in waiting], [], [], max(0.0, deadline - time.monotonic()))
                for w in [w for w in waiting if w.fd in readable]:
                    replies = w.replies()
                    if replies is None:  # died (e.g. out of memory): its comparison is not equal
                        self._died(w, busy)
                        continue
                    for reply in replies:
                        if reply.get("ready"):
                            w.ready = True
                        elif w in busy:
                            results[busy.pop(w)[0]] = bool(reply.get("equal"))
                now = time.monotonic()
                for w, (_, limit) in list(busy.items()):
                    if now >= limit:  # still computing: stop it for good
                        busy.pop(w)
                        self._drop(w)
                        self.timeouts += 1
                for w in [w for w in self.workers if not w.ready and now >= w.started + self.startup_timeout_s]:
                    self._drop(w)
                    raise RuntimeError(f"the math-verify worker did not start within {self.startup_timeout_s:.0f} s")
        finally:
            for w in list(busy):  # interrupted while waiting: leave nothing computing
                self._drop(w)
        return results

    def _staff(self, wanted: int) -> None:
        for w in [w for w in self.workers if not w.alive()]:
            self._drop(w)  # idle workers exit after idle_exit_s
        while len(self.workers) < min(self.size, wanted):
            self.workers.append(_Worker(self.idle_exit_s, self.memory_mb))

    def _died(self, w: _Worker, busy: dict) -> None:
        if not w.ready:
            error = w.startup_error()
            self._drop(w)
            raise RuntimeError(f"the math-verify worker failed to start (is math-verify installed? pip install 'rlvr[math]'):\n{error}")
        busy.pop(w, None)
        self._drop(w)

    def _drop(self, w: _Worker) -> None:
        w.kill()
        self.workers.remove(w)

    def close(self) -> None:
        with self._lock:
            for w in list(self.workers):
                self._drop(w)


_POOLS: weakref.WeakSet = weakref.WeakSet()
POOL = SymbolicPool(size=max(1, min(4, os.cpu_count() or 1)))


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS):
        for w in list(pool.workers):
            w.kill()
