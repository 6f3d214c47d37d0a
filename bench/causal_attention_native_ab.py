"""One training micro-batch of a floor config with the C causal attention (rlvr.models.native_causal_attention) on
and off, alternating in one process.

    python bench/causal_attention_native_ab.py L F G --reps 5 --out bench/results/causal_attention_native_ab_amd.md

Each config is built as bench/floor.py builds it and trained two steps (_floor_step.micro_batch_ab); then its first
micro-batch's forward + backward is timed --reps times per way, the ways alternating. The report gives the medians,
the calls the kernel took (query shape and key count) and the largest gradient difference between the ways relative
to the parameter's largest gradient (the kernel sums in another order than SDPA or the explicit products).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _floor_step import micro_batch_ab, relative_gap  # noqa: E402
from _report import cpu_name  # noqa: E402


def run(name: str, reps: int) -> str:
    from rlvr.models import native_causal_attention as nca

    calls: set = set()
    kernel = nca.causal_attention
    nca.causal_attention = lambda q, k, *a, **kw: calls.add((tuple(q.shape), k.shape[2])) or kernel(q, k, *a, **kw)
    try:
        ways = {"without": lambda: setattr(nca, "ON", False), "kernel": lambda: setattr(nca, "ON", True)}
        _, mb, seconds, grads = micro_batch_ab(name, ways, reps)
    finally:
        nca.causal_attention, nca.ON = kernel, True
    diff = relative_gap(grads["without"], grads["kernel"])
    off, on = statistics.median(seconds["without"]), statistics.median(seconds["kernel"])
    shapes = ", ".join(f"{list(q)} over {k}" for q, k in sorted(calls))
    return f"| {name} | {off:.3f} | {on:.3f} | {on / off:.3f} | {shapes} | {diff:.1e} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "causal_attention_native_ab.md"))
    a = ap.parse_args()
    lines = [
        "# One training micro-batch with the C causal attention on and off",
        "",
        f"Command: `python bench/causal_attention_native_ab.py {' '.join(a.configs)} --reps {a.reps}` "
        f"({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, 2 threads.  ",
        "Forward + backward of the config's first micro-batch, median seconds over the reps, the ways alternating in one process.",
        "",
        "| config | without s | kernel s | kernel / without | the kernel's calls: queries [B, H, Lq, D] over keys"
        " | gradients apart (relative) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in a.configs:
        lines.append(run(name, a.reps))
        print(lines[-1], flush=True)
    Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
