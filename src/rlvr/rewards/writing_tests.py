"""Rewarding model-written tests (the seeds' anti-hack example).

A test earns 1.0 only if it (1) contains at least one real assertion, one that calls
something and is not trivially true, (2) passes on the reference implementation and (3)
fails on every known-bad implementation; otherwise 0.0.

    >>> grade = test_writing()
    >>> ref = "def absval(x):\\n    return x if x >= 0 else -x"
    >>> bad = "def absval(x):\\n    return x"
    >>> grade(None, ["assert absval(-2) == 2", "assert absval(2) == 2", "print(absval(-2))"],
    ...       reference=[ref] * 3, buggy=[bad] * 3)
    [1.0, 0.0, 0.0]

Columns: `reference` (source of a correct implementation) and `buggy` (source of a known-bad
one, or a list of them); rename with `reference_column=` / `buggy_column=`. Known hacks
guarded: no assert at all; `assert True`, `assert 1`; `assert f(1) == f(1)`; tests that
always fail (they fail on the reference); tests that swallow their own failures
(`try: assert ... except: pass`, they pass on the buggy code too).
"""

from __future__ import annotations

import ast

from rlvr import sandbox
from rlvr.rewards.factory import named, reward_factory
from rlvr.rewards.text import completion_text, extract_code


def real_assertions(test_code: str) -> int:
    """Asserts that exercise code (contain a call) and are not trivially true."""
    try:
        tree = ast.parse(test_code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 0
    n = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        test = node.test
        if not any(isinstance(x, ast.Call) for x in ast.walk(test)):
            continue
        if isinstance(test, ast.Compare) and len(test.comparators) == 1 and ast.dump(test.left) == ast.dump(test.comparators[0]):
            continue  # assert f(1) == f(1)
        n += 1
    return n


@reward_factory
def test_writing(reference_column: str = "reference", buggy_column: str = "buggy", timeout_s: float = 10.0):
    """Build the test-writing grader."""

    def reward(prompts, completions, **columns):
        for col in (reference_column, buggy_column):
            if col not in columns:
                raise KeyError(f"test_writing grader: the dataset has no {col!r} column (have: {sorted(columns)})")
        tests = [extract_code(completion_text(c)) for c in completions]
        jobs, owners = [], []
        for i, (t, ref, bad) in enumerate(zip(tests, columns[reference_column], columns[buggy_column])):
            if ref is None or bad is None or real_assertions(t) == 0:
                continue
            for program in [ref, *([bad] if isinstance(bad, str) else bad)]:
                jobs.append(dict(program=program, tests=t, timeout_s=timeout_s))
                owners.append(i)
        results = sandbox.run_many(jobs)
        verdicts: dict[int, list] = {}
        for i, r in zip(owners, results):
            verdicts.setdefault(i, []).append(r)
        out: list[float | None] = []
        for i, (ref, bad) in enumerate(zip(columns[reference_column], columns[buggy_column])):
            if ref is None or bad is None:
                out.append(None)
                continue
            rs = verdicts.get(i, [])
            good = bool(rs) and rs[0].ok and rs[0].total > 0 and not any(r.ok for r in rs[1:])
            out.append(float(good))
        return out

    return named(reward, "test_writing")


setattr(test_writing, "__test__", False)  # noqa: B010 (mypy types no attributes on a Callable); tell pytest this is not a test
