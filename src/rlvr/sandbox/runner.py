"""Parent side of the sandbox: start the launcher, enforce the wall clock, read the verdict.

The parent never executes untrusted code. It starts `_launcher.py` in a new session (its own
process group), feeds it the job on stdin, and reads three pipes with caps: stdout, stderr
and a result pipe on which the harness writes one nonce-authenticated report. On the
deadline or when output runs over its cap, the whole process group is killed (and with it the
sandbox's PID namespace). The status comes from that report, never from the exit code alone.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import secrets
import selectors
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.sandbox.identity import sandbox_uid, wait_until_gone
from rlvr.sandbox.result import CRASHED, FAILED, LIMIT, PASSED, TIMEOUT, SandboxResult

log = logging.getLogger("rlvr.sandbox")
HERE = Path(__file__).parent
LAUNCHER = HERE / "_launcher.py"
HARNESS_SOURCE = (HERE / "_harness.py").read_text()
EXIT_GRACE_S = 0.3  # after the launcher exits, how long leftover pipe holders get before we stop reading
MAX_REPORT_BYTES = 8 * 1024 * 1024

_warned: set[str] = set()
_warn_lock = threading.Lock()


@dataclass(frozen=True)
class Limits:
    """Per-run limits. `timeout_s` is wall-clock for the whole run, start-up included."""

    timeout_s: float = 10.0
    memory_mb: int = 1024  # RLIMIT_AS of each process
    max_procs: int = 32  # RLIMIT_NPROC of the sandbox's uid
    file_mb: int = 16  # RLIMIT_FSIZE: largest file it may write
    disk_mb: int = 64  # size of its tmpfs working directory (when a mount namespace is available)
    max_files: int = 64  # RLIMIT_NOFILE
    output_limit: int = 256 * 1024  # bytes of stdout (and of stderr) kept; more is a `limit`

    def to_json(self) -> dict:
        return {
            "cpu_s": max(1, int(self.timeout_s + 0.999)),
            "memory_mb": self.memory_mb,
            "max_procs": self.max_procs,
            "file_mb": self.file_mb,
            "disk_mb": self.disk_mb,
            "max_files": self.max_files,
        }


def _warn_once(key: str, message: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(message)


WEAKER = {
    "netns": "no network namespace available: network is blocked only at the Python socket layer "
    "(audit hooks), which native code could bypass",
    "pidns": "no PID namespace available: leftover processes are found by uid or process group only",
    "uid_drop": "sandboxed programs run as your own user: a fork bomb is bounded only by RLIMIT_NPROC, "
    "and the program can read what you can read",
    "fs_locked": "no private mount namespace: the program can write wherever its user can (e.g. /tmp)",
}


def _hidden_dirs() -> list[str]:
    """Home directories to cover with an empty tmpfs, except ones holding the interpreter."""
    keep = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.executable)}
    out = []
    for d in {"/root", "/home", os.path.expanduser("~")}:
        p = Path(d).resolve()
        if p != Path("/") and not any(k == p or p in k.parents for k in keep):
            out.append(str(p))
    return sorted(out)


def _interpreter() -> dict | None:
    """Where this interpreter and its virtualenv live, for the launcher to bind them in."""
    base = Path(sys.base_prefix).resolve()
    exe = Path(sys.executable).resolve()
    if base not in exe.parents:
        return None
    venv = Path(sys.prefix).resolve()
    sites = [Path(p).resolve() for p in site.getsitepackages()] if hasattr(site, "getsitepackages") else []
    return {
        "base": str(base),
        "exe_rel": str(exe.relative_to(base)),
        "venv": str(venv) if venv != base else None,
        "site_rel": [str(p.relative_to(venv)) for p in sites if venv != base and venv in p.parents],
    }


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _collect(proc: subprocess.Popen, result_r: int, deadline: float, output_limit: int) -> tuple[dict, str]:
    """Read stdout/stderr/result until all close, the deadline passes, or output overflows."""
    bufs = {"stdout": bytearray(), "stderr": bytearray(), "result": bytearray()}
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None, "started with stdout=PIPE, stderr=PIPE"
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    result_file = os.fdopen(result_r, "rb", buffering=0)
    sel.register(result_file, selectors.EVENT_READ, "result")
    open_streams, ending, exited_at = 3, "", None
    try:
        while open_streams:
            now = time.monotonic()
            if now >= deadline:
                ending = "timeout"
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > EXIT_GRACE_S:
                break  # something left behind still holds a pipe; the group kill below ends it
            for key, _ in sel.select(timeout=min(0.05, deadline - now)):
                chunk = os.read(key.fd, 65536)  # the fileno() of key.fileobj
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                buf = bufs[key.data]
                cap = MAX_REPORT_BYTES if key.data == "result" else output_limit
                buf += chunk[: max(0, cap - len(buf))]
                if key.data != "result" and len(buf) >= cap:
                    ending = f"{key.data} exceeded {output_limit} bytes"
                    break
            if ending:
                break
    finally:
        sel.close()
        result_file.close()
    return bufs, ending


def _reap(proc: subprocess.Popen) -> None:
    """Kill the whole group, then reap the launcher. The launcher is waited for as a zombie
    first (WNOWAIT), so its pid, which is also the group id, cannot be reused by an unrelated
    process while we signal the group."""
    _kill_group(proc.pid)
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass
    _kill_group(proc.pid)
    proc.wait()


def _parse_result(raw: bytes, nonce: str) -> tuple[dict, str | None]:
    """The launcher's isolation lines come first; the report is the line carrying the nonce."""
    iso: dict[str, Any] = {}
    report: str | None = None
    for line in raw.decode("utf-8", "replace").splitlines():
        if line.startswith(nonce + " "):
            report = line[len(nonce) + 1 :]
        elif line.startswith(("iso ", "fs ")) and report is None:
            key = line.split(" ", 1)[0]
            if key not in iso.get("_seen", ()):
                try:
                    iso.update(json.loads(line.split(" ", 1)[1]))
                except ValueError:
                    pass
                iso.setdefault("_seen", []).append(key)
    iso.pop("_seen", None)
    return iso, report


def _status_without_report(code: int | None) -> tuple[str, str]:
    sig = code - 128 if code is not None and code > 128 else (-code if code is not None and code < 0 else 0)
    if sig == signal.SIGXCPU:
        return TIMEOUT, "CPU time limit"
    if sig == signal.SIGXFSZ:
        return LIMIT, "file size limit"
    if sig:
        return CRASHED, f"killed by signal {signal.Signals(sig).name if sig in signal.valid_signals() else sig}"
    return CRASHED, f"exited (code {code}) before the harness confirmed the tests ran"


def normalize_output(text: str) -> str:
    """Outputs compare equal when they differ only in trailing whitespace."""
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def _verdict(report: str, mode: str, expected: list[str] | None) -> tuple[str, int, int, str, list | None]:
    kind, _, rest = report.partition(" ")
    if kind == "compiled":
        return PASSED, 1, 1, "", None
    if kind == "error":
        return FAILED, 0, 1, ast.literal_eval(rest), None
    if kind == "io":
        assert expected is not None, "io jobs carry their expected outputs (rlvr.sandbox)"
        outputs = ast.literal_eval(rest)
        if not isinstance(outputs, list) or len(outputs) != len(expected):
            return CRASHED, 0, len(expected), "malformed report", None
        passed = sum(o is not None and normalize_output(o) == normalize_output(e) for o, e in zip(outputs, expected))
        return (PASSED if passed == len(expected) else FAILED), passed, len(expected), "", outputs
    if kind == "tests":
        passed, total, loaded, memory_errors = (int(x) for x in rest.split())
        if not loaded:
            return (LIMIT if memory_errors else FAILED), 0, total, "the program raised before the tests", None
        if mode == "assert" and total == 0:
            return FAILED, 0, 0, "the tests contain no test (no assert, call or block with an assert)", None
        if passed == total:
            return PASSED, passed, total, "", None
        return (LIMIT if memory_errors else FAILED), passed, total, f"{total - passed} of {total} tests failed", None
    return CRASHED, 0, 0, "malformed report", None


def execute(
    program: str, *, mode: str, tests=None, inputs=None, expected=None, limits: Limits = Limits(), network_namespace: bool = True
) -> SandboxResult:
    """Run one program in a fresh sandbox. Never raises: any failure is a `crashed` result.

    network_namespace=False skips the network namespace (to exercise the socket-level fallback).
    """
    start = time.monotonic()
    try:
        return _execute(program, mode, tests, inputs, expected, limits, network_namespace, start)
    except Exception as e:  # the trainer must never see a sandbox failure as an exception
        log.debug("sandbox failure", exc_info=True)
        return SandboxResult(CRASHED, reason=f"sandbox error: {type(e).__name__}: {e}", duration_s=time.monotonic() - start)


def _execute(program, mode, tests, inputs, expected, limits, network_namespace, start) -> SandboxResult:
    nonce = secrets.token_hex(16)
    n_cases = len(inputs or [])
    harness_job = {
        "nonce": nonce,
        "mode": mode,
        "program": program,
        "tests": tests,
        "inputs": inputs,
        "output_limit": limits.output_limit,
        "case_timeout_s": max(0.5, (limits.timeout_s - 0.5) / max(1, n_cases)),
    }
    bufs, ending, returncode = _launch(harness_job, limits, network_namespace, start)
    iso, report = _parse_result(bytes(bufs["result"]), nonce)
    for key, message in WEAKER.items():
        if iso and not iso.get(key, False):
            _warn_once(key, message)
    stdout, stderr = (bufs[k].decode("utf-8", "replace") for k in ("stdout", "stderr"))
    common = dict(stdout=stdout, stderr=stderr, duration_s=time.monotonic() - start, isolation=iso)
    total_guess = n_cases if mode == "io" else 0
    if ending == "timeout":
        return SandboxResult(TIMEOUT, 0, total_guess, reason=f"wall-clock limit of {limits.timeout_s} s", **common)
    if ending:
        return SandboxResult(LIMIT, 0, total_guess, reason=ending, **common)
    if report is None:
        status, reason = _status_without_report(returncode)
        return SandboxResult(status, 0, total_guess, reason=reason, **common)
    status, passed, total, reason, outputs = _verdict(report, mode, expected)
    return SandboxResult(status, passed, total, reason=reason, outputs=outputs, **common)


def _launch(harness_job: dict, limits, network_namespace, start) -> tuple[dict, str, int | None]:
    """Run the harness job in the launcher under a sandbox uid in a fresh working directory, and collect what it
    writes: (buffers by stream: result, stdout, stderr; how a limit ended the run, "" when none did; the
    launcher's exit status). The directory, the pipe and the process are gone when this returns."""
    workdir = tempfile.mkdtemp(prefix="rlvr-sandbox-")
    result_r, result_w = os.pipe()
    proc = None
    try:
        with sandbox_uid() as (uid, unique):
            job = {
                "python": sys.executable,
                "network_namespace": network_namespace,
                "harness_source": HARNESS_SOURCE,
                "harness_job": harness_job,
                "limits": limits.to_json(),
                "workdir": workdir,
                "hide": _hidden_dirs(),
                "uid": uid,
                "gid": uid,
                "uid_unique": unique,
                "result_fd": result_w,
                "interpreter": _interpreter(),
            }
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(LAUNCHER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(result_w,),
                start_new_session=True,
                cwd=workdir,
                env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
            os.close(result_w)
            result_w = -1
            assert proc.stdin is not None, "started with stdin=PIPE"
            try:
                proc.stdin.write(json.dumps(job).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            bufs, ending = _collect(proc, result_r, start + limits.timeout_s, limits.output_limit)
            result_r = -1  # closed by _collect
            _reap(proc)
            if unique:  # the slot's uid is handed out again only once its processes are gone
                wait_until_gone(uid)
    finally:
        for fd in (result_r, result_w):
            if fd >= 0:
                os.close(fd)
        if proc is not None and proc.returncode is None:
            _reap(proc)
        shutil.rmtree(workdir, ignore_errors=True)
    assert proc is not None, "started, or an exception left"
    return bufs, ending, proc.returncode
