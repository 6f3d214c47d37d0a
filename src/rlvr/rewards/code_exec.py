"""Code rewards: run the completion's program against the row's tests in the sandbox;
does it compile; is it lint-clean.

    >>> grade = code_tests()
    >>> grade(None, ["```python\\ndef sq(x):\\n    return x * x\\n```", "def sq(x): return 2 * x"],
    ...       tests=["assert sq(3) == 9\\nassert sq(2) == 4"] * 2)
    [1.0, 0.5]

The `tests` column (name it with `column=`) holds assert code (str or list of str) or stdin/stdout
pairs (`[{"input", "output"}]`, `{"inputs", "outputs"}`, or either as a JSON string). The program is
the completion's solution as `rlvr.rewards.text.extract_solution` finds it (the block defining the
row's `entry_point` column when there is one; prose, several blocks, test-only blocks and a missing
fence handled), after the row's `preamble` column when there is one (e.g. HumanEval's imports). Reward is
the fraction of tests passed, or 1/0 with `all_or_nothing=True`. Every program runs in
`rlvr.sandbox`, at most `rlvr.sandbox.max_concurrency()` at a time. A run that the harness did
not confirm (early exit, crash, timeout, limit) earns 0. Config:
`fn: "code(all_or_nothing=True, timeout_s=5)"`, `fn: code_compiles`, `fn: code_lint`.

Known hacks guarded: exiting before the tests, forging the harness's report, objects whose
`__eq__` is always True, patching the harness (see `rlvr.sandbox`); printing expected outputs
is useless because stdin/stdout outputs are compared outside the sandbox; an empty or
suppressed (`# noqa`) program is not lint-clean.
"""

from __future__ import annotations

import ast
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

from rlvr import sandbox
from rlvr.rewards.factory import named, reward_factory
from rlvr.rewards.text import completion_text, extract_solution

log = logging.getLogger("rlvr.rewards")


def _decode_tests(tests):
    if isinstance(tests, str) and tests.lstrip()[:1] in ("[", "{"):
        try:
            return json.loads(tests)
        except ValueError:
            pass  # assert code that happens to start with a bracket
    return tests


@reward_factory
def code(column: str = "tests", all_or_nothing: bool = False, timeout_s: float = 10.0, memory_mb: int = 1024):
    """Build the unit-test grader."""

    def reward(prompts, completions, **columns):
        if column not in columns:
            raise KeyError(f"code grader: the dataset has no {column!r} column (have: {sorted(columns)})")
        entry_points = columns.get("entry_point") or [None] * len(completions)
        preambles = columns.get("preamble") or [None] * len(completions)
        rows = [
            (i, (pre + "\n" if pre else "") + extract_solution(completion_text(c), entry), _decode_tests(t))
            for i, (c, t, entry, pre) in enumerate(zip(completions, columns[column], entry_points, preambles))
            if t is not None
        ]
        results = sandbox.run_many([dict(program=p, tests=t, timeout_s=timeout_s, memory_mb=memory_mb) for _, p, t in rows])
        out: list[float | None] = [None] * len(completions)
        for (i, _, _), r in zip(rows, results):
            out[i] = float(r.ok) if all_or_nothing else r.fraction
        return out

    return named(reward, "code")


def code_tests(**params):
    """`code()` under a descriptive name, for imports."""
    return code(**params)


def code_compiles(prompts, completions, **kwargs) -> list[float]:
    """1.0 when the extracted program compiles (compiled inside the sandbox, never run)."""
    entry_points = kwargs.get("entry_point") or [None] * len(completions)
    programs = [extract_solution(completion_text(c), entry) for c, entry in zip(completions, entry_points)]
    results = [sandbox.check_compiles(p) if p.strip() else None for p in programs]
    return [float(r is not None and r.ok) for r in results]


# ------------------------------------------------------------------------------------ lint

RUFF_RULES = "E9,F"  # syntax errors and pyflakes: undefined names, unused imports/variables, ...


def ruff_executable() -> str | None:
    """ruff from this interpreter's environment (a venv need not be on PATH), else from PATH."""
    beside = Path(sys.executable).parent / "ruff"
    return str(beside) if beside.is_file() else shutil.which("ruff")


def _ruff_issues(program: str, rules: str) -> int | None:
    """Number of ruff findings, or None when ruff is unavailable. ruff only parses the code."""
    exe = ruff_executable()
    if exe is None:
        return None
    proc = subprocess.run(
        [
            exe,
            "check",
            "--no-cache",
            "--ignore-noqa",
            "--isolated",
            "--select",
            rules,
            "--output-format",
            "json",
            "--stdin-filename",
            "solution.py",
            "-",
        ],
        input=program.encode(),
        capture_output=True,
        timeout=20,
    )
    try:
        return len(json.loads(proc.stdout or b"[]"))
    except ValueError:
        return 1  # ruff could not make sense of it: not clean


def builtin_issues(program: str) -> int:
    """Fallback lint without ruff: syntax errors, unused imports, star imports, bare excepts."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 1
    imported: dict[str, int] = {}
    issues = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    issues += 1
                else:
                    imported[(alias.asname or alias.name).split(".")[0]] = 1
        elif isinstance(node, ast.ExceptHandler) and node.type is None:
            issues += 1
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    exported = {
        elt.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
        and isinstance(n.value, (ast.List, ast.Tuple))
        for elt in n.value.elts
        if isinstance(elt, ast.Constant)
    }
    return issues + sum(1 for name in imported if name not in used and name not in exported)


def _has_code(program: str) -> bool:
    try:
        body = ast.parse(program).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True  # let the linter report the syntax error
    real = [n for n in body if not (isinstance(n, ast.Pass) or isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    return bool(real)


_warned_no_ruff = False


@reward_factory
def code_lint(rules: str = RUFF_RULES, use_ruff: bool = True):
    """Build the lint-clean grader: 1.0 when the program has no findings (ruff if installed,
    `pip install 'rlvr[code]'`; a built-in check otherwise), 0.0 otherwise or when empty."""

    def reward(prompts, completions, **kwargs):
        global _warned_no_ruff
        out = []
        entry_points = kwargs.get("entry_point") or [None] * len(completions)
        for c, entry in zip(completions, entry_points):
            program = extract_solution(completion_text(c), entry)
            if not _has_code(program):
                out.append(0.0)
                continue
            issues = _ruff_issues(program, rules) if use_ruff else None
            if issues is None:
                if use_ruff and not _warned_no_ruff:
                    _warned_no_ruff = True
                    log.warning("code_lint: ruff not installed (pip install 'rlvr[code]'); using the built-in checks")
                issues = builtin_issues(program)
            out.append(float(issues == 0))
        return out

    return named(reward, "code_lint")
