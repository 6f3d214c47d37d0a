"""The built-in `math` grader against math-verify's own `verify(parse(gold), parse(completion))` on
the labelled set of tests/math_grading_cases.py: accuracy, wrong answers paid, time per call.

    PYTHONPATH=src python bench/graders.py [--out bench/results/graders.md]

Accuracy is agreement with the human label of each case (paid iff right). math-verify runs on the
main thread here, so its own signal-based time limits (5 s parsing, 5 s verifying) are on; the
built-in grader runs with its defaults (symbolic comparisons in a worker process, 3 s each).
Times are per call (one completion); the built-in grader's first call, which starts the worker
process, is timed apart. A second part times one step's worth of completions graded together.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from math_grading_cases import CASES  # noqa: E402

from rlvr.models.precision_choice import cpu_model  # noqa: E402
from rlvr.rewards import symbolic  # noqa: E402
from rlvr.rewards.math_answer import grade  # noqa: E402


def run_builtin(case) -> float:
    return grade([case.prompt], [case.completion], [case.gold], fallback=case.fallback)[0]


def run_math_verify(case) -> float:
    from math_verify import parse, verify

    try:
        return float(verify(parse(case.gold), parse(case.completion)))
    except Exception:  # its TimeoutException included: not paid
        return 0.0


def measure(fn) -> tuple[list[float], list[float]]:
    verdicts, seconds = [], []
    for case in CASES:
        start = time.perf_counter()
        verdicts.append(fn(case))
        seconds.append(time.perf_counter() - start)
    return verdicts, seconds


def summary(name: str, verdicts: list[float], seconds: list[float]) -> dict:
    right = [c.right for c in CASES]
    paid_wrong = [c for c, v in zip(CASES, verdicts) if v and not c.right]
    missed = [c for c, v in zip(CASES, verdicts) if not v and c.right]
    return {
        "grader": name,
        "accuracy": sum(float(bool(v)) == r for v, r in zip(verdicts, right)) / len(CASES),
        "paid_wrong": len(paid_wrong),
        "missed_right": len(missed),
        "median_ms": 1e3 * statistics.median(seconds),
        "max_ms": 1e3 * max(seconds),
        "paid_wrong_kinds": sorted({c.kind for c in paid_wrong}),
        "slowest": max(zip(seconds, CASES), key=lambda x: x[0])[1].kind,
    }


def batch_time(n: int = 1024) -> float:
    """Seconds per completion when one step's completions (GSM8K/AIME-style, numbers only) are graded together."""
    pool = [c for c in CASES if c.kind in ("gsm8k", "aime")]
    cases = [pool[i % len(pool)] for i in range(n)]
    start = time.perf_counter()
    grade([c.prompt for c in cases], [c.completion for c in cases], [c.gold for c in cases])
    return (time.perf_counter() - start) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="write the results as markdown here")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # math-verify warns per call

    start = time.perf_counter()
    grade(None, ["\\boxed{\\sqrt{4}}"], ["2"])  # starts the worker process
    cold = time.perf_counter() - start
    run_math_verify(CASES[0])  # its first call imports sympy's parsers
    rows = [
        summary("rlvr math (built-in)", *measure(run_builtin)),
        summary("math-verify verify(parse(gold), parse(completion))", *measure(run_math_verify)),
    ]
    per_completion = batch_time()

    lines = [
        "# The math grader against math-verify on the labelled set",
        "",
        "Command: `PYTHONPATH=src python bench/graders.py --out bench/results/graders.md`  ",
        f"CPU: {cpu_model()}; Python {platform.python_version()}; math-verify "
        f"{__import__('importlib.metadata').metadata.version('math-verify')}; worker pool size {symbolic.POOL.size}; "
        f"load average during the run {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (shared machine: times inflated).  ",
        f"Cases: {len(CASES)} (tests/math_grading_cases.py), {sum(c.right for c in CASES)} right answers and "
        f"{sum(1 - c.right for c in CASES)} wrong ones; accuracy is agreement with the label.",
        "",
        "| grader | accuracy | wrong answers paid | right answers missed | median per call | max per call "
        "| classes of wrong answers paid |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['grader']} | {r['accuracy']:.1%} | {r['paid_wrong']} | {r['missed_right']} | {r['median_ms']:.2f} ms | "
            f"{r['max_ms']:.0f} ms ({r['slowest']}) | {', '.join(r['paid_wrong_kinds']) or '-'} |"
        )
    lines += [
        "",
        f"Built-in grader, first call (starts the math-verify worker process): {cold:.2f} s. "
        f"One step's completions graded together (1024 GSM8K/AIME-style answers, numbers compared in-process): "
        f"{per_completion * 1e6:.0f} µs per completion.",
        "",
        "The built-in grader's max is a comparison stopped at its time limit (3 s); math-verify's own limits are "
        "signal-based and only work on the main thread, as here (in training's worker threads they are off).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
