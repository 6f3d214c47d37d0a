"""One training micro-batch with the C passes of the training forward against torch's ops for the same math, in one
process: the rotation of q and k and its backward (rlvr.models.native_training_rotary), then that and the MLPs' bf16
SwiGLU both ways (rlvr.models.native_swiglu), then those and RMSNorm's backward (rlvr.models.native_training_norm).
One Trainer on a bench/floor.py config, two training steps, then its first micro-batch's forward and backward `--reps`
times per way, alternating the order. The rotation and the SwiGLU give torch's bits, the norm's backward the same math
in another order: the table gives each way's largest gradient gap against torch's ops (relative to each tensor's
largest entry; 0 is bit for bit).

    cd bench && python native_training_ab.py B E L J F G --reps 6 --out results/native_training_amx.md && cd ..
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rlvr.models.native_swiglu as native_swiglu  # noqa: E402
import rlvr.models.native_training_norm as native_training_norm  # noqa: E402
import rlvr.models.native_training_rotary as native_training_rotary  # noqa: E402
from _floor_step import micro_batch_ab, relative_gap  # noqa: E402
from _report import emit, result_head, table_row  # noqa: E402

PASSES = {"rotation": native_training_rotary, "SwiGLU": native_swiglu, "norm": native_training_norm}  # (switch: ON)
WAYS = {"torch's ops": (), "rotation": ("rotation",), "rotation + SwiGLU": ("rotation", "SwiGLU"), "all three": tuple(PASSES)}


def switch(on: tuple[str, ...]) -> None:
    for name, module in PASSES.items():
        module.ON = name in on


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["B"])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = result_head(
        "A training micro-batch: the training forward's C passes vs torch's ops",
        f"cd bench && python native_training_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config; the same micro-batch {args.reps} times per way, alternating which goes first",
        ["config", "precision", *(f"{w} s" for w in WAYS), *(f"{w} / torch's (medians)" for w in list(WAYS)[1:])]
        + ["largest gradient gap"],
    )
    for name in args.configs:
        ways = {w: (lambda on=on: switch(on)) for w, on in WAYS.items()}
        trainer, _, seconds, grads = micro_batch_ab(name, ways, args.reps)
        switch(tuple(PASSES))
        medians = [statistics.median(seconds[w]) for w in WAYS]
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        ratios = [f"{m / medians[0]:.3f}" for m in medians[1:]]
        gaps = [relative_gap(grads[list(WAYS)[0]], g) for g in list(grads.values())[1:]]
        lines.append(table_row(name, trainer.precision.name, *runs, *ratios, ", ".join(f"{gap:.1e}" for gap in gaps)))
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
