"""How long grading 64 small programs takes in the sandbox: sequential vs the bounded pool.

    python bench/sandbox_bench.py            # prints a markdown table (bench/results/sandbox.md)

Each program is a small function with three assert tests, a mix of right and wrong answers,
like a batch of 64 code completions. One warm-up run first; then the median of `--repeats`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from rlvr.sandbox import isolation, run_many

VARIANTS = [
    "def f(x):\n    return x * x\n",
    "def f(x):\n    return x + x\n",
    "def f(x):\n    total = 0\n    for _ in range(abs(x)):\n        total += abs(x)\n    return total\n",
    "def f(x):\n    return sorted([x * x, 0])[1] if x else 0\n",
]
TESTS = "assert f(3) == 9\nassert f(-2) == 4\nassert f(0) == 0\n"


def batch(n: int) -> list[dict]:
    return [dict(program=VARIANTS[i % len(VARIANTS)] + f"# sample {i}\n", tests=TESTS, timeout_s=10) for i in range(n)]


def timed(jobs: list[dict], workers: int) -> tuple[float, int]:
    start = time.perf_counter()
    results = run_many(jobs, workers=workers)
    return time.perf_counter() - start, sum(r.ok for r in results)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    jobs = batch(args.programs)
    timed(jobs[:4], 2)  # warm-up: page cache, imports
    rows = []
    for w in args.workers:
        runs = [timed(jobs, w) for _ in range(args.repeats)]
        rows.append((w, statistics.median(t for t, _ in runs), runs[0][1]))
    print(f"{args.programs} programs x 3 assert tests, {os.cpu_count()} CPUs, isolation: {isolation()}\n")
    print("| workers | wall s (median of %d) | ms / program | speed-up | passed |" % args.repeats)
    print("|---|---|---|---|---|")
    base = rows[0][1]
    for w, t, ok in rows:
        print(f"| {w} | {t:.2f} | {1000 * t / args.programs:.0f} | {base / t:.2f}x | {ok}/{args.programs} |")


if __name__ == "__main__":
    main()
