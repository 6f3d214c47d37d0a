"""One training micro-batch with the grouped prefix attention's scores in two dense buffers and native_softmax_pair's C
softmax over both, against one buffer of P + C scores per row and aten's softmax (the way before 2026-12-07), in one
process: one Trainer on a bench/floor.py config, two training steps, then its first micro-batch's forward and backward
`--reps` times per way, alternating the order. The kernel computes aten's softmax to an ulp or two of fp32 before the
rounding (its own exp): the table gives the largest gradient gap between the ways (relative to each tensor's largest
entry). Configs whose training forward does not share the prompt (or whose attention is not the grouped products)
time the same code twice.

    cd bench && python softmax_pair_ab.py F C B J E G --reps 6 --out results/softmax_pair_amx.md && cd ..
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rlvr.models.native_softmax_pair as native_softmax_pair  # noqa: E402
from _floor_step import micro_batch_ab, relative_gap  # noqa: E402
from _report import emit, result_head, table_row  # noqa: E402

WAYS = {"one buffer, aten's softmax": False, "two buffers, C softmax": True}


def switch(on: bool) -> None:
    native_softmax_pair.ON = on


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["F"])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = result_head(
        "A training micro-batch: the grouped prefix attention's scores in two dense buffers with one C softmax vs one buffer",
        f"cd bench && python softmax_pair_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config; the same micro-batch {args.reps} times per way, alternating which goes first",
        ["config", "precision", *(f"{w} s" for w in WAYS), "two / one (medians)", "largest gradient gap"],
    )
    for name in args.configs:
        ways = {w: (lambda on=on: switch(on)) for w, on in WAYS.items()}
        trainer, _, seconds, grads = micro_batch_ab(name, ways, args.reps)
        switch(True)
        medians = [statistics.median(seconds[w]) for w in WAYS]
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        gap = relative_gap(*grads.values())
        lines.append(table_row(name, trainer.precision.name, *runs, f"{medians[1] / medians[0]:.3f}", f"{gap:.1e}"))
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
