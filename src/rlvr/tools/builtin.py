"""The built-in tools: `calculator` (safe arithmetic) and `python` (a sandboxed session).

`calculator` walks the expression's syntax tree and allows only numbers, + - * / // % **,
unary signs and parentheses, with the work bounded (exponents, digits), so no input can run
code or stall a worker. `PythonSession.python` runs code in `rlvr.sandbox` (never in this
process); a session lives for one episode and keeps its state by replaying the calls that
succeeded (output suppressed) before the new code, since every sandbox run is a fresh process.
"""

from __future__ import annotations

import ast
import math
import operator
import threading

from rlvr.sandbox import PASSED, TIMEOUT, run_python
from rlvr.tools.calling import cap

MAX_CHARS = 2000
MAX_EXPONENT = 1000
MAX_DIGITS = 1000
_MAX_BITS = int(MAX_DIGITS * math.log2(10)) + 1
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_SYMBOLS = {ast.BitXor: "^ (use ** for powers)", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>", ast.MatMult: "@"}


def _check(value):
    """Refuse results too large to be useful (and too costly to keep computing with)."""
    if isinstance(value, complex):
        raise ValueError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is too large")
    if isinstance(value, int) and abs(value).bit_length() > _MAX_BITS:
        raise ValueError(f"the result has more than {MAX_DIGITS} digits")
    return value


def _power(base, exp):
    if isinstance(exp, float) and exp.is_integer():
        exp = int(exp)
    if abs(exp) > MAX_EXPONENT:
        raise ValueError(f"the exponent {exp} is too large (limit {MAX_EXPONENT})")
    # Estimate before computing, so 10**999 * ... chains cannot build a huge number first.
    if abs(base) > 1 and exp > 0 and exp * math.log10(abs(base)) > MAX_DIGITS + 1:
        raise ValueError(f"the result has more than {MAX_DIGITS} digits")
    return base**exp


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ValueError(f"only numbers are allowed, not {node.value!r}")
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _eval(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _OPS:
            raise ValueError(f"the operator {_SYMBOLS.get(type(node.op), type(node.op).__name__)} is not supported")
        left, right = _eval(node.left), _eval(node.right)
        try:
            value = _power(left, right) if isinstance(node.op, ast.Pow) else _OPS[type(node.op)](left, right)
        except OverflowError:
            raise ValueError("the result is too large") from None
        return _check(value)
    if isinstance(node, ast.Name):
        raise ValueError(f"names are not allowed (found {node.id!r}); use numbers and + - * / // % **")
    if isinstance(node, ast.Call):
        raise ValueError("function calls are not allowed; use numbers and + - * / // % **")
    raise ValueError(f"{type(node).__name__} is not allowed; use numbers and + - * / // % **")


def _format(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))  # exact integers print as integers: 6/3 -> 2
    return repr(value) if isinstance(value, float) else str(value)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: The expression, e.g. "12*34" or "(2+3)**2/5"; numbers, + - * / // % ** and parentheses.

    Returns:
        The value of the expression.
    """
    if len(expression) > MAX_CHARS:
        raise ValueError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {e.msg}") from None
    except ValueError as e:  # e.g. an integer literal over the interpreter's digit limit
        raise ValueError(str(e)) from None
    try:
        return _format(_eval(tree))
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None


class PythonSession:
    """A Python session for one episode (stateful: one instance per episode)."""

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 900, traceback_lines: int = 8):
        # Defaults sit below ToolRunner's (10 s, 1000 chars), so the session's own messages
        # (its timeout, the error at the end of the output) reach the model intact.
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.max_output_chars = max_output_chars
        self.traceback_lines = traceback_lines
        self._history: list[str] = []  # calls that ran without error, replayed before each new one
        self._lock = threading.Lock()  # two calls in one turn must not interleave their state

    def _program(self, code: str) -> str:
        run = f"exec(compile({code!r}, '<cell>', 'exec'))\n"
        if not self._history:
            return run
        return (
            "import sys as __rlvr_sys, io as __rlvr_io\n"
            "__rlvr_out = __rlvr_sys.stdout, __rlvr_sys.stderr\n"
            "__rlvr_sys.stdout = __rlvr_sys.stderr = __rlvr_io.StringIO()\n"
            f"for __rlvr_cell in {self._history!r}:\n"
            "    exec(compile(__rlvr_cell, '<previous>', 'exec'))\n"
            "__rlvr_sys.stdout, __rlvr_sys.stderr = __rlvr_out\n"
            "del __rlvr_sys, __rlvr_io, __rlvr_out, __rlvr_cell\n" + run
        )

    def _traceback(self, stderr: str) -> str:
        lines = stderr.rstrip().splitlines()
        start = next((i for i, line in enumerate(lines) if '"<cell>"' in line), None)
        lines = lines[start:] if start is not None else lines
        if len(lines) > self.traceback_lines:
            lines = lines[:1] + ["  ..."] + lines[-(self.traceback_lines - 1) :]
        return "\n".join(["Traceback (most recent call last):", *lines] if start is not None else lines)

    def python(self, code: str) -> str:
        """Run Python code and return what it prints.
        Variables, functions and imports from earlier calls in this conversation are kept.

        Args:
            code: Python source code; use print() to show results.

        Returns:
            What the code printed, followed by the error if it failed.
        """
        with self._lock:
            result = run_python(self._program(code), timeout_s=self.timeout_s, memory_mb=self.memory_mb)
            if result.status == PASSED:
                self._history.append(code)
        if result.status == PASSED:
            return cap(result.stdout, self.max_output_chars) or "(no output; print() what you want to see)"
        if result.status == TIMEOUT:
            error = f"error: timeout: the code ran longer than {self.timeout_s}s"
        elif '"<cell>"' in result.stderr:  # the code raised (MemoryError included): its traceback
            error = self._traceback(result.stderr)
        else:  # the sandbox's own words, less what only concerns graded tests
            reason = (result.reason or "no details").replace(" before the harness confirmed the tests ran", "")
            error = f"error: {result.status}: {reason}"
        half = self.max_output_chars // 2
        if len(error) > half:  # the end of a traceback says what went wrong
            error = "..." + error[-(half - 3) :]
        # The output gets what the error leaves, less room for the truncation marker.
        out = cap(result.stdout.rstrip(), max(0, self.max_output_chars - len(error) - 30))
        return f"{out}\n{error}" if out.strip() else error
