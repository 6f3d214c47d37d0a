"""A training micro-batch with the heap's free top kept up to 2 GiB (rlvr.models.cpu_memory before) and kept whole
(now: glibc's trimming off), each way in processes of its own, alternating.

    python bench/heap_trim_ab.py Q --shape 'Q={"llama": {...}, ...}' --rounds 2 --reps 3 --out bench/results/heap_trim_intel.md

A worker builds bench/floor.py's config as floor.py does (optim.skip_zero_advantage=false added, so that a shape
whose groups all score alike still trains), runs two steps, sets the way's trim threshold, then times the last
step's first micro-batch (forward + backward) `--reps` times, with the minor page faults of each (getrusage: pages
the kernel mapped and zeroed anew). A micro-batch that frees more than 2 GiB at once gave it back to the system with
the threshold at 2 GiB and faulted it in again the next time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

WAYS = {"top kept up to 2 GiB": 2**31 - 1, "top kept whole": -1}  # way: glibc's M_TRIM_THRESHOLD


def worker(name: str, shapes: list[str], threshold: int, reps: int) -> dict:
    import ctypes
    import ctypes.util
    import resource
    import time

    import floor
    from _floor_step import first_micro_batch, floor_step

    from rlvr.models import cpu_memory

    for shape in shapes:
        floor.add_shape(shape)
    trainer = floor_step(name, extra=["optim.skip_zero_advantage=false"], steps=2).trainer  # applies keep_freed_memory
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    assert libc.mallopt(cpu_memory.M_TRIM_THRESHOLD, threshold) == 1
    mb = first_micro_batch(trainer)
    assert mb is not None, "the step trained no rows"
    mb.run()
    seconds, faults = [], []
    for _ in range(reps):
        before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        mb.run()
        seconds.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "faults": faults, "rows": len(range(*mb.rows.indices(10**9))), "peak_mib": peak_mib}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--shape", action="append", default=[], help="bench/floor.py's --shape NAME=JSON")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print("RESULT " + json.dumps(worker(args.config, args.shape, int(args.worker), args.reps)), flush=True)
        return
    from _report import emit, result_head, table_row

    results: dict[str, list[dict]] = {way: [] for way in WAYS}
    for r in range(args.rounds):
        for way, threshold in list(WAYS.items())[:: 1 if r % 2 == 0 else -1]:  # the order alternates round by round
            cmd = [sys.executable, __file__, args.config, "--worker", str(threshold), "--reps", str(args.reps)]
            cmd += [f"--shape={s}" for s in args.shape]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            rec = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
            results[way].append(rec)
            print(way, rec, flush=True)
    lines = result_head(
        "A training micro-batch: the heap's free top kept up to 2 GiB against kept whole",
        f"python bench/heap_trim_ab.py {' '.join(sys.argv[1:])}",
        f"config {args.config}, one process per way and round ({args.rounds} rounds, order alternating), the micro-batch timed "
        f"{args.reps} times after one run.",
        ["way", "seconds per micro-batch (each round's)", "median", "page faults per micro-batch (median)", "peak RSS MiB"],
    )
    for way, recs in results.items():
        seconds = [s for rec in recs for s in rec["seconds"]]
        per_round = " / ".join(" ".join(f"{s:.2f}" for s in rec["seconds"]) for rec in recs)
        faults = statistics.median(f for rec in recs for f in rec["faults"])
        peak = max(rec["peak_mib"] for rec in recs)
        lines.append(table_row(way, per_round, f"{statistics.median(seconds):.2f}", f"{faults:.0f}", f"{peak:.0f}"))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
