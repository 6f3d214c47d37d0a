"""Which unprivileged uid a sandbox runs as.

Root ignores RLIMIT_NPROC, so a sandbox started by root must drop to another uid for the
process limit to hold. Each concurrent sandbox gets its own uid (derived from this process's
pid and a slot number): RLIMIT_NPROC counts all processes of a uid, so a fork bomb in one
sandbox then cannot starve another, and after the run "kill every process of this uid" hits
exactly the leftovers of that one sandbox.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager

SLOTS = 512
NOBODY = 65534
_lock = threading.Lock()
_free = list(range(SLOTS))


def _mapped(uid: int, count: int = 1) -> bool:
    """Whether uids [uid, uid+count) exist in this user namespace (containers often map few)."""
    try:
        with open("/proc/self/uid_map") as f:
            ranges = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    except OSError:
        return False
    return any(inside <= uid and uid + count <= inside + length for inside, _, length in ranges)


def uid_base() -> int:
    return 100_000_000 + os.getpid() * SLOTS  # pid_max <= 2**22, so this stays below 2**32 - 1


@contextmanager
def sandbox_uid():
    """Yields (uid, unique): a private uid for one run, `nobody` as a shared fallback, or
    (None, False) when this process is not root and cannot switch uid at all."""
    if os.geteuid() != 0:
        yield None, False
        return
    if not _mapped(uid_base(), SLOTS):
        yield (NOBODY, False) if _mapped(NOBODY) else (None, False)
        return
    with _lock:
        slot = _free.pop(0) if _free else None  # FIFO: a uid is reused as late as possible
    if slot is None:  # more concurrent sandboxes than slots: share `nobody` rather than fail
        yield NOBODY, False
        return
    try:
        yield uid_base() + slot, True
    finally:
        with _lock:
            _free.append(slot)


def live_processes(uid_lo: int, uid_hi: int) -> list[int]:
    """Pids of processes (zombies excluded) whose uid lies in [uid_lo, uid_hi)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if uid_lo <= os.stat(f"/proc/{pid}").st_uid < uid_hi:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
                if state not in (b"Z", b"X"):
                    found.append(int(pid))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return found


def wait_until_gone(uid: int, timeout_s: float = 2.0) -> bool:
    """After a kill, SIGKILL lands asynchronously: wait until no live process has `uid`."""
    deadline = time.monotonic() + timeout_s
    while live_processes(uid, uid + 1):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
