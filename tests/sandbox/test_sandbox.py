"""The sandbox against model-style attacks: each is contained, earns nothing, ends in time.

Every attacking program would solve the task (`add`) only if its attack worked, so a
non-passing result means the attack failed, and the side-effect checks say the machine and
this test process were unharmed. Limits are kept small so the suite stays fast and bounded.
"""

from __future__ import annotations

import os
import secrets
import socket
import textwrap
import time
from pathlib import Path

import pytest

from rlvr.sandbox import isolation, run_many, run_python
from rlvr.sandbox.identity import SLOTS, live_processes, uid_base
from rlvr.sandbox.runner import execute, Limits
from _paths import REPO

ADD_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert add(10, 5) == 15"
GOOD = "def add(a, b):\n    return a + b\n"
SLACK_S = 1.5  # start-up and reaping on a loaded 2-core machine
ISO = isolation()
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to a private uid")


def sandbox(program: str, tests=ADD_TESTS, **kw):
    kw.setdefault("timeout_s", 3)
    start = time.monotonic()
    result = run_python(textwrap.dedent(program), tests, **kw)
    assert time.monotonic() - start < kw["timeout_s"] + SLACK_S, "run exceeded its wall-clock limit"
    return result


def contained(result) -> None:
    assert result.status != "passed" and result.passed == 0 and result.fraction == 0.0, result


def sandbox_processes() -> list[int]:
    """Live processes still running under any of this test process's sandbox uids."""
    return live_processes(uid_base(), uid_base() + SLOTS)


# ---------------------------------------------------------------- the honest baseline


def test_correct_program_passes_and_wrong_one_fails():
    good = sandbox(GOOD)
    assert (good.status, good.passed, good.total) == ("passed", 3, 3)
    half = sandbox("def add(a, b):\n    return a + b if a > 0 else 7\n")
    assert (half.status, half.passed, half.total) == ("failed", 2, 3)


def test_stdin_stdout_cases_are_compared_outside_the_sandbox():
    prog = "a, b = map(int, input().split())\nprint(a + b)\n"
    r = sandbox(prog, [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5", "output": "10"}, {"input": "0 0", "output": "1"}])
    assert (r.status, r.passed, r.total) == ("failed", 2, 3)
    assert r.outputs == ["3\n", "10\n", "0\n"]


def test_isolation_in_force_on_this_machine():
    # This machine (root, namespaces allowed) gets every wall; elsewhere the run still works.
    if os.geteuid() == 0 and ISO.get("netns"):
        assert ISO == {"netns": True, "pidns": True, "mountns": True, "userns": False, "uid_drop": True, "fs_locked": True}
    assert sandbox("import os\nassert os.getuid() != 0\n" + GOOD).status == ("passed" if ISO.get("uid_drop") else "failed")


# ---------------------------------------------------------------- resource attacks


def test_infinite_loop_times_out():
    r = sandbox("while True:\n    pass\n" + GOOD, timeout_s=1.5)
    contained(r)
    assert r.status == "timeout"


@root_only
def test_fork_bomb_is_bounded_and_leaves_no_process_behind():
    counted = sandbox(
        """
        import os, time
        n = 0
        try:
            while n < 10_000:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                n += 1
        except OSError:
            pass
        print(n)
    """,
        tests=None,
        max_procs=12,
        timeout_s=3,
    )
    assert counted.status == "passed" and int(counted.stdout) < 12  # forks refused past the limit
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n" + GOOD
    bomb_r, good_r = run_many(
        [dict(program=bomb, tests=ADD_TESTS, timeout_s=2, max_procs=12), dict(program=GOOD, tests=ADD_TESTS, timeout_s=5)], workers=2
    )
    contained(bomb_r)
    assert bomb_r.status == "timeout"
    assert good_r.status == "passed", "a fork bomb in one sandbox starved another"
    assert sandbox_processes() == []


def test_allocating_20_gb_hits_the_memory_limit():
    r = sandbox("x = bytearray(20 * 2**30)\n" + GOOD, memory_mb=512)
    contained(r)
    assert r.status == "limit"


def test_writing_a_5_gb_file_is_stopped_at_the_file_size_limit(tmp_path):
    r = sandbox(
        """
        chunk = b"\\0" * 2**20
        with open("big.bin", "wb") as f:
            for _ in range(5 * 1024):
                f.write(chunk)
    """
        + GOOD,
        file_mb=8,
    )
    contained(r)
    assert r.status in ("failed", "limit")


def test_printing_1_gb_is_cut_at_the_output_limit():
    r = sandbox(
        "import sys\nline = 'x' * 65535 + '\\n'\nfor _ in range(2**14):\n    sys.stdout.write(line)\n" + GOOD, output_limit=64 * 1024
    )
    contained(r)
    assert r.status == "limit" and len(r.stdout) <= 64 * 1024


@pytest.mark.parametrize(
    "program",
    [
        "def f(n):\n    return f(n + 1)\nf(0)\n",
        "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1) + 1\nf(0)\n",
    ],
)
def test_recursion_bomb(program):
    r = sandbox(program + GOOD, timeout_s=2)
    contained(r)  # RecursionError, a C-stack crash, MemoryError or the clock: all earn nothing


def test_daemonised_child_is_gone_afterwards():
    r = sandbox(
        """
        import os, subprocess, time
        subprocess.Popen(["sleep", "120"], start_new_session=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)
            os._exit(0)
        time.sleep(0.2)
        raise SystemExit(0)
    """
        + GOOD
    )
    contained(r)
    assert r.duration_s < 2.5  # nobody waited for the daemons
    if os.geteuid() == 0:
        assert sandbox_processes() == []


# ---------------------------------------------------------------- escape attempts


def test_writing_outside_its_directory_fails():
    name = f"rlvr-pwned-{secrets.token_hex(4)}"
    targets = [REPO / name, Path("/tmp") / name, Path("/var/tmp") / name]
    program = "".join(f"open({str(t)!r}, 'w').write('pwned')\n" for t in targets)
    for t in targets:  # each attempt on its own, so one failure cannot shadow another
        r = sandbox(f"open({str(t)!r}, 'w').write('pwned')\n" + GOOD)
        contained(r)
    assert program and not any(t.exists() for t in targets)


def test_reading_the_parents_secret_env_var_fails(monkeypatch):
    secret = secrets.token_hex(8)
    monkeypatch.setenv("RLVR_TEST_SECRET", secret)
    r = sandbox(
        f"""
        import os
        s = os.environ.get("RLVR_TEST_SECRET") or open("/proc/{os.getpid()}/environ").read()
        print(s)
        assert "{secret}" in s
    """
        + GOOD
    )
    contained(r)
    assert secret not in r.stdout + r.stderr


def test_reading_a_file_in_the_parents_home_fails():
    home = Path.home()
    secret_file = home / f".rlvr-test-secret-{secrets.token_hex(4)}"
    secret = secrets.token_hex(8)
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    try:
        r = sandbox(f"print(open({str(secret_file)!r}).read())\n" + GOOD)
    finally:
        secret_file.unlink()
    contained(r)
    assert secret not in r.stdout + r.stderr


@pytest.mark.parametrize("network_namespace", [True, False], ids=["netns", "socket-block-fallback"])
def test_tcp_connection_to_a_local_listener_fails(network_namespace):
    if not network_namespace and not ISO.get("netns"):
        pytest.skip("the fallback is what runs anyway")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n" + GOOD
        r = execute(program, mode="assert", tests=ADD_TESTS, limits=Limits(timeout_s=3), network_namespace=network_namespace)
        contained(r)
        listener.settimeout(0.2)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()


def test_killing_the_parent_fails_and_this_process_survives():
    me = os.getpid()
    r = sandbox(
        f"""
        import os, signal
        for target in (os.getppid(), {me}, 1):
            try:
                os.kill(target, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.kill(-1, signal.SIGKILL)   # everything it may signal: only itself and its own
        except OSError:
            pass
        os.kill({me}, signal.SIGKILL)     # raises: the test process is out of reach
    """
        + GOOD
    )
    contained(r)
    assert os.getpid() == me  # still here


# ---------------------------------------------------------------- faking a pass


@pytest.mark.parametrize("exit_call", ["sys.exit(0)", "os._exit(0)", "raise SystemExit(0)"])
def test_exiting_before_the_tests_run_earns_nothing(exit_call):
    forged = "".join(
        f"    try:\n        os.write({fd}, b'{secrets.token_hex(16)} tests 3 3 1 0\\n')\n    except OSError:\n        pass\n"
        for fd in range(3, 12)
    )
    r = sandbox(f"import os, sys\nprint('tests 3 3 1 0')\nfor _ in [0]:\n{forged}def add(a, b):\n    return 0\n{exit_call}\n")
    contained(r)


def test_monkeypatching_the_harness_and_assertion_helpers_changes_nothing():
    r = sandbox("""
        import builtins, sys, os
        for blocked in ("import ctypes", "import gc; gc.get_objects()", "sys.settrace(lambda *a: None)",
                        "open('/proc/self/mem', 'rb')", "sys._current_frames()", "import _ctypes"):
            try:
                exec(blocked)
                print("NOT BLOCKED:", blocked)
            except Exception:
                pass
        main = sys.modules["__main__"]
        for name in ("check_values", "is_plain", "split_assert"):
            setattr(main, name, lambda *a, **k: True)
        builtins.eval = lambda *a, **k: (True,)
        builtins.exec = lambda *a, **k: None
        builtins.isinstance = lambda *a: False
        builtins.AssertionError = type("NotAnError", (Exception,), {})
        builtins.bool = lambda *a: True
        os.write = lambda *a: 0
        try:
            sys.audit("rlvr.report", "tests 3 3 1 0")
        except RuntimeError:
            pass
        frame = sys._getframe(1)      # walk up to the harness's main frame and call its reporter
        try:
            frame.f_locals["audit"]("rlvr.report", "tests 3 3 1 0")
        except Exception:
            pass
        def add(a, b):
            return 999
    """)
    contained(r)
    assert "NOT BLOCKED" not in r.stdout


def test_objects_that_equal_everything_do_not_pass():
    for returned in ("AlwaysEqual()", "Sneaky(0)", "[AlwaysEqual()]"):
        r = sandbox(
            f"""
            class AlwaysEqual:
                def __eq__(self, other):
                    return True
                __ne__ = lambda self, other: False
            class Sneaky(int):
                __eq__ = lambda self, other: True
            def add(a, b):
                return {returned}
        """,
            tests="assert add(2, 3) == 5\nassert [add(1, 1)] == [[2]]\nassert add(0, 0) == add(0, 0)",
        )
        contained(r)


def test_helpers_redefined_inside_compound_tests_change_nothing():
    tests = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(1, 1) == 2\ncheck(add)\n"
    assert sandbox(GOOD, tests=tests).status == "passed"
    r = sandbox(
        """
        class AlwaysEqual:
            __eq__ = lambda self, other: True
        def add(a, b):
            globals()["__rlvr_check__"] = lambda *a: True
            return AlwaysEqual()
    """,
        tests=tests,
    )
    contained(r)
