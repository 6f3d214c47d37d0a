"""One training micro-batch of a floor config with the fp32 SwiGLU in C (rlvr.models.native_swiglu.SwiGLUF32) on and
off, alternating in one process.

    python bench/swiglu_f32_ab.py L F H --reps 5 --out bench/results/swiglu_f32_ab_amd.md

Each config is built as bench/floor.py builds it and trained two steps (_floor_step.micro_batch_ab); then its first
micro-batch's forward + backward is timed --reps times per way, the ways alternating. The report gives the medians,
the calls the kernel took ([rows, intermediate]) and the largest gradient difference between the ways relative to the
parameter's largest gradient (the kernel's sigmoid rounds apart from torch's).
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
    from rlvr.models import native_swiglu

    calls: set = set()
    apply = native_swiglu.SwiGLUF32.apply
    native_swiglu.SwiGLUF32.apply = lambda gate, up: calls.add(tuple(gate.shape)) or apply(gate, up)
    try:
        off, on = (lambda: setattr(native_swiglu, "F32_TRAINING", False)), (lambda: setattr(native_swiglu, "F32_TRAINING", True))
        ways = {"torch": off, "kernel": on}
        _, mb, seconds, grads = micro_batch_ab(name, ways, reps)
    finally:
        native_swiglu.SwiGLUF32.apply, native_swiglu.F32_TRAINING = apply, True
    diff = relative_gap(grads["torch"], grads["kernel"])
    off, on = statistics.median(seconds["torch"]), statistics.median(seconds["kernel"])
    shapes = ", ".join(str(list(s)) for s in sorted(calls)) or "none"
    return f"| {name} | {off:.3f} | {on:.3f} | {on / off:.3f} | {shapes} | {diff:.1e} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "swiglu_f32_ab.md"))
    a = ap.parse_args()
    lines = [
        "# One training micro-batch with the fp32 SwiGLU in C on and off",
        "",
        f"Command: `python bench/swiglu_f32_ab.py {' '.join(a.configs)} --reps {a.reps}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, 2 threads.  ",
        "Forward + backward of the config's first micro-batch, median seconds over the reps, the ways alternating in one process.",
        "",
        "| config | torch s | kernel s | kernel / torch | the kernel's calls: [rows, intermediate] | gradients apart (relative) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in a.configs:
        lines.append(run(name, a.reps))
        print(lines[-1], flush=True)
    Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
