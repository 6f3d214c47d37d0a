"""Sandbox harness: runs one untrusted program and its tests, and reports a result it vouches for.

Copied into the sandbox's working directory and run there as `python -I harness.py job.json FD`.
The program runs in this same interpreter (assert tests must call its functions), so nothing
the harness keeps in Python memory is out of the program's reach. The design keeps the
pass count trustworthy anyway:

- The job file (with a one-time nonce) is read and deleted before the program runs. The nonce
  then lives only in the closure of an audit hook, which the interpreter holds in C and
  Python code cannot enumerate. Without the nonce a report line is ignored by the parent,
  so exiting early (`sys.exit(0)`, `os._exit(0)`) or printing a fake result earns nothing.
- The hook writes the report only for an `rlvr.report` audit event raised from the harness's
  own `main` frame (checked by frame identity): the program cannot call it on its own behalf.
- The hook also blocks the ways to read or rewrite another frame's memory or the hook itself
  (ctypes/cffi, gc.get_objects/get_referrers, sys._current_frames, settrace/setprofile,
  new audit hooks, /proc/*/mem), and, when the OS gave no network namespace, sockets and
  process spawning.
- Top-level `assert a == b` tests are not executed as asserts: their operands are evaluated
  in the program's namespace and compared *here*, with references captured before the
  program ran, and only between plain built-in values (exact types). An object whose
  `__eq__` always returns True, a patched `AssertionError` or a redefined helper changes
  nothing.

Residual risk, stated honestly: a program that hand-crafts raw bytecode (marshal) can read
interpreter memory; the OS-level walls (namespaces, uid, rlimits) still hold then.
"""

import ast
import builtins
import os
import sys

BLOCKED_IMPORTS = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend", "_testcapi", "_testinternalcapi"})
BLOCKED_EVENTS = frozenset(
    {
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "sys._current_frames",
        "sys.settrace",
        "sys.setprofile",
        "sys.addaudithook",
        "code.__new__",
        "os.symlink",
    }
)
FROZEN_DEFAULTS = frozenset({"__defaults__", "__kwdefaults__"})  # of the harness's own functions
NETWORK_EVENTS = frozenset(
    {
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
    }
)


def make_undumpable():
    """PR_SET_DUMPABLE=0: other processes of this uid cannot read our memory via /proc/<pid>/mem.

    ctypes is needed for prctl; it is dropped from sys.modules again so that the program's
    own `import ctypes` goes through the (blocking) import audit event.
    """
    import ctypes

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.") or m == "_ctypes"]:
        del sys.modules[name]


def install_guard(nonce, result_fd, block_network, protected=()):
    """Install the audit hook that blocks introspection and alone can emit a valid report.

    Called from `main`, whose frame becomes the only one allowed to report. Touches only
    exact str/bytes arguments, so no program-defined method ever runs inside the hook.
    """
    main_frame = sys._getframe(1)
    getframe, write, str_, bytes_, type_ = sys._getframe, os.write, str, bytes, type

    reported = [False]

    def hook(event, args):
        if event == "rlvr.report":
            if reported[0] or getframe(1) is not main_frame or type_(args[0]) is not str_:
                raise RuntimeError("forged report")
            reported[0] = True
            write(result_fd, (nonce + " " + args[0] + "\n").encode())
        elif event == "import":
            if args[0] in BLOCKED_IMPORTS:
                raise ImportError(f"module {args[0]!r} is disabled in the sandbox")
        elif event in BLOCKED_EVENTS:
            raise RuntimeError(f"{event} is disabled in the sandbox")
        elif event == "object.__setattr__":
            name = args[1]
            if type_(name) is str_ and (name == "__code__" or name in FROZEN_DEFAULTS and any(args[0] is f for f in protected)):
                raise RuntimeError(f"setting {name} is disabled in the sandbox")
        elif event == "open":
            path = args[0]
            if type_(path) is bytes_:
                path = path.decode("utf-8", "replace")
            if type_(path) is str_:
                # /proc/<pid>/mem in any spelling (relative, via /proc/self/root, ...) ends in "mem"
                if path.rstrip("/").rsplit("/", 1)[-1] == "mem":
                    raise PermissionError("process memory is off limits in the sandbox")
            elif type_(path) is not int:
                raise PermissionError("open() takes a str, bytes or fd path in the sandbox")
        elif block_network and event in NETWORK_EVENTS:
            raise PermissionError(f"{event} is disabled in the sandbox (no network namespace)")

    sys.addaudithook(hook)


def load_job(path):
    """Read the job and delete it, so the program cannot read the nonce from disk."""
    import json

    with open(path) as f:
        job = json.load(f)
    os.unlink(path)
    return job


NONE_TYPE = type(None)  # named here, not called in is_plain's defaults (ruff B008); still bound at import


def is_plain(
    value,
    _type=type,
    _plain=(
        int,
        float,
        complex,
        str,
        bytes,
        bool,
        NONE_TYPE,
        list,
        tuple,
        dict,
        set,
        frozenset,
    ),
    _dict=dict,
    _seqs=(list, tuple, set, frozenset),
    _max=1_000_000,
):
    """True when `value` is built only from built-in value types (exact types, no subclasses).

    Every name it uses is a default argument bound at import, before the program runs
    (and `__defaults__` cannot be reassigned in the sandbox).
    """
    stack, seen = [value], 0
    while stack:
        v = stack.pop()
        t = _type(v)
        if t not in _plain:
            return False
        seen += 1
        if seen > _max:
            return False
        if t is _dict:
            stack.extend(v.keys())
            stack.extend(v.values())
        elif t in _seqs:
            stack.extend(v)
    return True


COMPARE_OPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot)
COMPARE_FNS = (
    lambda a, b: a == b,
    lambda a, b: a != b,
    lambda a, b: a < b,
    lambda a, b: a <= b,
    lambda a, b: a > b,
    lambda a, b: a >= b,
    lambda a, b: a in b,
    lambda a, b: a not in b,
    lambda a, b: a is b,
    lambda a, b: a is not b,
)


def check_values(values, op_ids, _plain=is_plain, _fns=COMPARE_FNS, _len=len, _range=range, _bool=bool):
    """The trusted comparison of `v0 op0 v1 op1 v2 ...` (or the truth of v0 when there are no
    ops), between plain values only."""
    for i in _range(_len(values)):
        if not _plain(values[i]):
            return False
    if not op_ids:
        return _bool(values[0])
    for i in _range(_len(op_ids)):
        if not _fns[op_ids[i]](values[i], values[i + 1]):
            return False
    return True


class _RewriteAsserts(ast.NodeTransformer):
    """Inside compound tests: `assert a < b` becomes `assert __rlvr_check__((a, b), (2,))`."""

    def visit_Assert(self, node):
        values, ops = split_assert(node)
        call = ast.Call(
            ast.Name("__rlvr_check__", ast.Load()),
            [ast.Tuple(values, ast.Load()), ast.Tuple([ast.Constant(i) for i in ops], ast.Load())],
            [],
        )
        return ast.copy_location(ast.Assert(call, None), node)


def split_assert(node):
    """`assert a < b <= c` -> ([a, b, c], [Lt, LtE] as indices); `assert x` -> ([x], [])."""
    test = node.test
    if isinstance(test, ast.Compare) and all(type(o) in COMPARE_OPS for o in test.ops):
        return [test.left, *test.comparators], [COMPARE_OPS.index(type(o)) for o in test.ops]
    return [test], []


def compile_tests(source):
    """Split test code into a tuple of steps: ("assert", code, ops) / ("block", code) / ("setup", code)."""
    steps: list[tuple[object, ...]] = []  # (kind, code) or (kind, code, ops)
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assert):
            values, ops = split_assert(node)
            expr = ast.copy_location(ast.Tuple(values, ast.Load()), node)
            code = compile(ast.fix_missing_locations(ast.Expression(expr)), "tests.py", "eval")
            steps.append(("assert", code, tuple(ops)))
            continue
        has_assert = any(isinstance(n, ast.Assert) for n in ast.walk(node))
        is_call = isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        kind = "block" if has_assert and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or is_call else "setup"
        node = ast.fix_missing_locations(_RewriteAsserts().visit(node))
        steps.append((kind, compile(ast.Module([node], []), "tests.py", "exec")))
    return tuple(steps)


def run_io_cases(job):
    """stdin/stdout tests: each input in a fresh child process; outputs compared by the parent."""
    import subprocess

    with open("solution.py", "w") as f:
        f.write(job["program"])
    outputs, limit = [], job["output_limit"]
    for i, text in enumerate(job["inputs"]):
        with open(f"in{i}.txt", "w") as f:
            f.write(text)
        with open(f"in{i}.txt", "rb") as fin, open(f"out{i}.txt", "wb") as fout:
            try:
                proc = subprocess.run(
                    [
                        sys.executable,
                        "-I",
                        "harness.py",
                        "--run",
                        "solution.py",
                        str(int(job["net_isolated"])),
                        *(job.get("sys_path") or []),
                    ],
                    stdin=fin,
                    stdout=fout,
                    stderr=subprocess.DEVNULL,
                    timeout=job["case_timeout_s"],
                )
                ok = proc.returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
        with open(f"out{i}.txt", "rb") as f:
            out = f.read(limit).decode("utf-8", "replace")
        outputs.append(out if ok else None)
        os.unlink(f"out{i}.txt")
    return outputs


def run_file_as_main(path, net_isolated):
    """`--run`: the child of an io case. Same guard (no report), then the program as __main__."""
    install_guard("", -1, block_network=not net_isolated)
    sys.path.extend(p for p in sys.argv[4:])
    import runpy

    runpy.run_path(path, run_name="__main__")


def compile_report(program):
    """`compile` mode: whether the program compiles (nothing of it runs)."""
    try:
        compile(program, "solution.py", "exec")
        return "compiled"
    except BaseException as e:
        return "error " + repr(type(e).__name__ + ": " + str(e)[:500])


def run_program_and_tests(program, steps, mode):
    """Run the program, then its test steps, in this interpreter; the "tests ..." report line.

    Everything used once the program has run is captured first, as this frame's fast locals
    (which other frames cannot rebind): the program may patch builtins, modules, globals."""
    eval_, exec_, isinstance_ = eval, exec, isinstance
    base_exc, memory_error, check = BaseException, MemoryError, check_values
    import traceback

    print_exc = traceback.print_exc  # diagnostics only: a patched traceback changes no verdict
    total = len([s for s in steps if s[0] != "setup"])
    ns = {"__name__": "solution" if mode == "assert" else "__main__", "__builtins__": builtins}
    passed = memory_errors = 0
    loaded = alive = True
    try:
        exec_(compile(program, "solution.py", "exec"), ns)
    except base_exc as e:
        loaded = alive = False
        memory_errors += isinstance_(e, memory_error)
        try:
            print_exc(limit=-5)
        except base_exc:
            pass
    # Tests get their own globals: a program function rebinding names in its module
    # (`globals()["__rlvr_check__"] = ...`) cannot reach the tests' comparison helper.
    scope = {**ns, "__rlvr_check__": check}
    for step in steps:
        if not alive:
            break
        try:
            if step[0] == "assert":
                ok = check(eval_(step[1], scope), step[2])
            else:
                exec_(step[1], scope)
                ok = True
        except base_exc as e:
            memory_errors += isinstance_(e, memory_error)
            ok = False
            alive = step[0] != "setup"
            try:
                print_exc(limit=-2)
            except base_exc:
                pass
        if ok is True and step[0] != "setup":
            passed += 1
    return "tests %d %d %d %d" % (passed, total, loaded, memory_errors)


def main():
    job = load_job(sys.argv[1])
    sys.path.extend(job.get("sys_path") or [])  # the trainer's virtualenv, bound in read-only
    result_fd = int(sys.argv[2])
    os.set_inheritable(result_fd, False)
    mode = job["mode"]
    make_undumpable()
    install_guard(job.pop("nonce"), result_fd, block_network=not job["net_isolated"] and mode != "io", protected=(is_plain, check_values))
    # What reports once the program has run is captured now, as this frame's fast locals, as
    # run_program_and_tests captures what it uses: the program may patch builtins, modules, globals.
    audit, exit_, flush_out, flush_err, base_exc = sys.audit, os._exit, sys.stdout.flush, sys.stderr.flush, BaseException
    if mode == "compile":
        payload = compile_report(job["program"])
    elif mode == "io":  # the program runs in child processes
        payload = "io " + repr(run_io_cases(job))
    else:
        payload = run_program_and_tests(job["program"], compile_tests(job["tests"]) if mode == "assert" else (), mode)
    try:
        flush_out()
        flush_err()
    except base_exc:
        pass
    audit("rlvr.report", payload)
    exit_(0)


if __name__ == "__main__":
    if sys.argv[1] == "--run":
        run_file_as_main(sys.argv[2], sys.argv[3] == "1")
    else:
        main()
