"""Run model-written Python where it cannot escape, and say how it did.

    >>> from rlvr.sandbox import run_python
    >>> r = run_python("def add(a, b):\\n    return a + b", "assert add(2, 3) == 5\\nassert add(0, 0) == 1")
    >>> r.status, r.passed, r.total
    ('failed', 1, 2)

`tests` may be assert-based code (a string or a list of strings; each top-level `assert`, call
or compound statement containing an assert is one test), stdin/stdout pairs
(`[{"input": "1 2\\n", "output": "3\\n"}, ...]` or `{"inputs": [...], "outputs": [...]}`), or None
to just run the program. Each run gets its own process group, namespaces (network, PID, mount)
where the OS allows them, an unprivileged uid when started as root, rlimits, a fresh working
directory and a scrubbed environment; see `_launcher.py` and `_harness.py` for the walls and
`isolation()` for what is in force on this machine. Many runs go through a bounded pool:
`run_many`, and at most `max_concurrency()` sandboxes run at once per process.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from rlvr.sandbox.result import CRASHED, FAILED, LIMIT, PASSED, STATUSES, TIMEOUT, SandboxResult
from rlvr.sandbox.runner import Limits, execute, normalize_output

__all__ = [
    "run_python",
    "run_many",
    "check_compiles",
    "isolation",
    "set_max_concurrency",
    "max_concurrency",
    "SandboxResult",
    "Limits",
    "normalize_output",
    "PASSED",
    "FAILED",
    "TIMEOUT",
    "CRASHED",
    "LIMIT",
    "STATUSES",
]

_concurrency = max(1, os.cpu_count() or 1)
_gate = threading.BoundedSemaphore(_concurrency)


def set_max_concurrency(n: int) -> None:
    """Cap the sandboxes running at once in this process (default: the CPU count)."""
    global _concurrency, _gate
    _concurrency, _gate = max(1, int(n)), threading.BoundedSemaphore(max(1, int(n)))


def max_concurrency() -> int:
    return _concurrency


def _split_tests(tests) -> tuple[str, dict]:
    """Which harness mode, and its arguments, for each accepted form of `tests`."""
    if tests is None:
        return "run", {}
    if isinstance(tests, str):
        return "assert", {"tests": tests}
    if isinstance(tests, dict) and "inputs" in tests:
        return "io", {"inputs": [str(x) for x in tests["inputs"]], "expected": [str(x) for x in tests["outputs"]]}
    tests = list(tests)
    if tests and all(isinstance(t, dict) for t in tests):
        return "io", {"inputs": [str(t["input"]) for t in tests], "expected": [str(t["output"]) for t in tests]}
    if all(isinstance(t, str) for t in tests):
        return "assert", {"tests": "\n".join(tests)}
    raise TypeError("tests must be assert code (str or list of str), stdin/stdout pairs, or None")


def _limits(timeout_s, memory_mb, overrides) -> Limits:
    return Limits(timeout_s=timeout_s, memory_mb=memory_mb, **overrides)


def run_python(program: str, tests=None, *, timeout_s: float = 10.0, memory_mb: int = 1024, **limits) -> SandboxResult:
    """Run `program` (Python source) against `tests` in a fresh sandbox; never raises.

    Extra keyword limits: max_procs, file_mb, disk_mb, max_files, output_limit (see `Limits`).
    """
    try:
        mode, kw = _split_tests(tests)
        lim = _limits(timeout_s, memory_mb, limits)
    except (TypeError, KeyError, ValueError) as e:
        return SandboxResult(CRASHED, reason=f"bad tests or limits: {e}")
    with _gate:
        return execute(program, mode=mode, limits=lim, **kw)


def check_compiles(program: str, *, timeout_s: float = 5.0, memory_mb: int = 512) -> SandboxResult:
    """Compile without running. Compiling happens in the sandbox too: pathological source can
    exhaust the compiler's memory or stack, and that must not happen in the trainer."""
    with _gate:
        return execute(program, mode="compile", limits=Limits(timeout_s=timeout_s, memory_mb=memory_mb))


def run_many(jobs: Sequence[dict], *, workers: int | None = None) -> list[SandboxResult]:
    """Run many `run_python(**job)` calls in a bounded thread pool; results in input order."""
    jobs = list(jobs)
    if not jobs:
        return []
    workers = max(1, min(workers or _concurrency, len(jobs)))
    if workers == 1:
        return [run_python(**job) for job in jobs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlvr-sandbox") as pool:
        return list(pool.map(lambda job: run_python(**job), jobs))


_isolation: dict | None = None


def isolation() -> dict:
    """What this machine's sandbox actually enforces (runs one trivial program, cached):
    netns, pidns, mountns, userns, uid_drop, fs_locked."""
    global _isolation
    if _isolation is None:
        _isolation = run_python("pass", timeout_s=10).isolation
    return dict(_isolation)
