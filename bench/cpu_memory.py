"""Elementwise ops on large CPU tensors with glibc's default malloc and with freed memory kept
(rlvr.models.cpu_memory, on by default: keep_cpu_memory=true) -> bench/results/cpu_memory.md.

Each setting runs in its own process (the malloc setting is process-wide), alternating, `--rounds` times; each
op's result is a new tensor (as in a model's forward and backward), freed before the next call. Reported: the
median ms per op and the minor page faults per op (from getrusage: the kernel mapping and zeroing fresh pages).

    python bench/cpu_memory.py --threads 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _report import cpu_name, table_row  # noqa: E402

SIZES_MIB = (8, 16, 32, 64, 128)
OPS = ("mul", "silu", "add", "clone")


def worker(keep: bool, threads: int, reps: int) -> dict:
    import resource

    import torch

    if keep:
        from rlvr.models.cpu_memory import keep_freed_memory

        assert keep_freed_memory()
    torch.set_num_threads(threads)
    fns = {
        "mul": lambda a, b: a * b,
        "silu": lambda a, b: torch.nn.functional.silu(a),
        "add": lambda a, b: a + b,
        "clone": lambda a, b: a.clone(),
    }
    out = {}
    for mib in SIZES_MIB:
        a, b = torch.randn(mib << 18), torch.randn(mib << 18)  # fp32: mib MiB each
        for name, fn in fns.items():
            for _ in range(10):  # warm: the kept heap reaches its size, glibc's small-block caches fill
                fn(a, b)
            faults, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            for _ in range(reps):
                fn(a, b)
            ms = (time.perf_counter() - t) / reps * 1e3
            out[f"{name}/{mib}"] = {"ms": ms, "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / reps}
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "cpu_memory.md")
    ap.add_argument("--worker", choices=("plain", "kept"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print("RESULT " + json.dumps(worker(a.worker == "kept", a.threads, a.reps)))
        return
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"), OMP_NUM_THREADS=str(a.threads))
    runs: dict[str, list[dict]] = {"plain": [], "kept": []}
    for rnd in range(a.rounds):
        for setting in sorted(runs, reverse=rnd % 2 == 1):
            p = subprocess.run(
                [sys.executable, __file__, "--worker", setting, "--threads", str(a.threads), "--reps", str(a.reps)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[setting].append(json.loads(next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))[7:]))
    med = {s: {k: statistics.median(r[k]["ms"] for r in rs) for k in rs[0] if k != "peak_rss_mb"} for s, rs in runs.items()}
    faults = {s: {k: statistics.median(r[k]["faults"] for r in rs) for k in rs[0] if k != "peak_rss_mb"} for s, rs in runs.items()}
    L = [
        "# Large CPU tensors: glibc's malloc as it is, and with freed memory kept (keep_cpu_memory)",
        "",
        f"Command: `python bench/cpu_memory.py --threads {a.threads} --rounds {a.rounds} --reps {a.reps}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}; {cpu_name()}, {os.cpu_count()} cpus, {a.threads} threads).",
        "",
        "Each op makes a new fp32 tensor of the size given (its inputs are that size too), freed before the next call; "
        f"medians over {a.rounds} processes per setting (alternating), {a.reps} calls each after 10 warm-up calls. "
        "`plain`: malloc as glibc sets it (blocks of 32 MiB and more are mapped fresh and unmapped on free); "
        "`kept`: rlvr.models.cpu_memory.keep_freed_memory() (mmap off, the heap's top kept).",
        "",
        table_row("op", "MiB", "plain ms", "kept ms", "plain / kept", "page faults per op, plain", "kept"),
        table_row(*["---"] * 7),
    ]
    for name in OPS:
        for mib in SIZES_MIB:
            k = f"{name}/{mib}"
            p, q = med["plain"][k], med["kept"][k]
            L.append(
                table_row(name, str(mib), f"{p:.2f}", f"{q:.2f}", f"{p / q:.2f}x", f"{faults['plain'][k]:.0f}", f"{faults['kept'][k]:.0f}")
            )
    rss = {s: ", ".join(f"{r['peak_rss_mb']:.0f}" for r in rs) for s, rs in runs.items()}
    L += ["", f"Peak RSS per process (MiB): plain {rss['plain']}; kept {rss['kept']}.", ""]
    a.out.write_text("\n".join(L))
    print("\n".join(L))


if __name__ == "__main__":
    main()
