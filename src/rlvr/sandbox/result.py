"""What one sandboxed run produced: a status in words plus the details behind it."""

from __future__ import annotations

from dataclasses import dataclass, field

PASSED, FAILED, TIMEOUT, CRASHED, LIMIT = "passed", "failed", "timeout", "crashed", "limit"
STATUSES = (PASSED, FAILED, TIMEOUT, CRASHED, LIMIT)


@dataclass
class SandboxResult:
    """Outcome of `run_python`. Only `passed`/`total` from a harness-confirmed report count.

    status: passed (every test passed; with no tests: the program ran to its end without an
    error), failed (it ran, some test failed or the program raised), timeout (wall-clock or
    CPU limit), limit (memory, file size, output size), crashed (killed by a signal, or
    exited before the harness could confirm the tests ran).
    """

    status: str
    passed: int = 0
    total: int = 0
    stdout: str = ""
    stderr: str = ""
    reason: str = ""
    duration_s: float = 0.0
    outputs: list[str | None] | None = None  # stdin/stdout tests: what the program printed per case
    isolation: dict = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        """Share of tests passed; 0 when nothing was confirmed."""
        return self.passed / self.total if self.total else 0.0

    @property
    def ok(self) -> bool:
        return self.status == PASSED
