"""The `math` grader against a labelled set (tests/math_grading_cases.py), case by case; its time
bound on pathological answers, from a worker thread, leaving nothing running."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from math_grading_cases import CASES
from rlvr.rewards import load_reward_fn, symbolic
from rlvr.rewards.math_answer import grade

KINDS = Counter(c.kind for c in CASES)


def test_the_labelled_set_covers_ordinary_answers_and_every_hack_class():
    assert len(CASES) >= 150
    assert KINDS["gsm8k"] >= 30 and KINDS["math"] >= 30 and KINDS["aime"] >= 10
    for kind in (
        "hedge_or",
        "hedge_markers",
        "hedge_list",
        "no_marker",
        "fallback",
        "number_minus",
        "number_commas",
        "number_percent",
        "number_sci",
        "equation",
        "units",
        "echo",
        "negation",
        "truncated",
        "huge",
    ):
        assert KINDS[kind] >= 2, kind
    assert sum(c.right for c in CASES) >= 80 and sum(1 - c.right for c in CASES) >= 80


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c.kind}" for i, c in enumerate(CASES)])
def test_labelled_case(case):
    """Every right answer is paid (bar the documented misses) and no wrong one ever is."""
    got = grade([case.prompt], [case.completion], [case.gold], fallback=case.fallback)[0]
    assert got == (0.0 if case.known_miss else float(case.right))


def test_without_math_verify_no_wrong_answer_is_paid(monkeypatch):
    """The exact fallback (math-verify not installed) pays less, never more."""
    monkeypatch.setattr(symbolic, "AVAILABLE", False)
    cases = [c for c in CASES if c.kind != "huge"]
    got = [grade([c.prompt], [c.completion], [c.gold], fallback=c.fallback)[0] for c in cases]
    assert not [c for c, g in zip(cases, got) if g and not c.right]
    numeric = [(c, g) for c, g in zip(cases, got) if c.kind in ("gsm8k", "aime", "number_percent", "number_sci") and c.right]
    assert all(g == 1.0 for _, g in numeric)  # numbers never need math-verify


def test_config_parameters():
    grade_fn = load_reward_fn("math(fallback='last_number', timeout_s=2)")
    assert grade_fn(None, ["So 42 in total.", "#### 41"], answer=["42", "42"]) == [1.0, 0.0]
    assert load_reward_fn("math")(None, ["So 42 in total."], answer=["42"]) == [0.0]
    for bad, message in (("math(fallback='last')", "fallback"), ("math(timeout_s=0)", "timeout_s")):
        with pytest.raises(ValueError, match=message):
            load_reward_fn(bad)


# ------------------------------------------------------------------ time bound

TOWER = "\\boxed{9^{9^{9}}}"
DIGITS = "\\boxed{" + "9" * 50_000 + "}"
NESTED = "\\boxed{" + "-(" * 70 + "1" + ")" * 70 + "}"  # math-verify's parser is exponential in the depth


def _children() -> dict[int, str]:
    """{pid: state} of this process's child processes (Linux /proc)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid():
                out[int(entry.name)] = fields[0]
    return out


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not symbolic.AVAILABLE, reason="needs math-verify")
def test_pathological_answers_return_within_the_limit_from_a_thread_and_leave_nothing_running():
    limit = 1.0
    threads_before = set(threading.enumerate())
    timings, killed = {}, []

    def grade_all():
        for name, completion in (("tower", TOWER), ("digits", DIGITS), ("nested", NESTED)):
            grade(None, ["\\boxed{\\sqrt{4}}"], ["2"], timeout_s=30)  # a worker ready, so its start-up is not timed
            workers = set(symbolic.POOL.pids)
            start = time.monotonic()
            timings[name] = (grade(None, [completion], ["2"], timeout_s=limit)[0], time.monotonic() - start)
            killed.extend(workers - set(symbolic.POOL.pids))

    worker = threading.Thread(target=grade_all)
    worker.start()
    worker.join(120)
    assert not worker.is_alive()
    assert {name: verdict for name, (verdict, _) in timings.items()} == {"tower": 0.0, "digits": 0.0, "nested": 0.0}
    for name, (_, seconds) in timings.items():
        assert seconds < limit + 0.75, (name, seconds)
    assert killed  # the tower's worker (and the nested one's) was stopped ...
    children = _children()
    assert not set(killed) & set(children)  # ... and is gone, reaped
    assert set(children) <= set(symbolic.POOL.pids)  # what is left is the pool's idle workers
    cpu = {pid: _cpu_seconds(pid) for pid in children}
    time.sleep(0.5)
    assert all(_cpu_seconds(pid) - cpu[pid] < 0.05 for pid in children)  # idle, computing nothing
    # Nothing new left running (threads from earlier tests may end meanwhile: idle tool workers time out).
    assert [t for t in threading.enumerate() if t not in threads_before] == []
    symbolic.POOL.close()
    assert not _children()
