"""One training micro-batch with the C passes of the training forward (rlvr.models.native_training_rotary: the
rotation of q and k and its backward) against torch's ops for the same math, in one process: one Trainer on a
bench/floor.py config, two training steps, then its first micro-batch's forward and backward `--reps` times per way,
alternating which goes first. The passes give torch's bits: the table says whether the gradients are the same.

    cd bench && python native_training_ab.py B E L J --reps 6 --out results/native_training_amx.md && cd ..
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rlvr.models.native_training_rotary as native_training_rotary  # noqa: E402
from _floor_step import micro_batch_ab, same_gradients  # noqa: E402
from _report import emit, result_head, table_row  # noqa: E402

SWITCHES = [(native_training_rotary, "ON")]  # each pass's module and its switch
WAYS = {"torch's ops": False, "C passes": True}


def switch(on: bool) -> None:
    for module, flag in SWITCHES:
        setattr(module, flag, on)


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
        ["config", "precision", *(f"{w} s" for w in WAYS), "C passes / torch's (medians)", "same gradients"],
    )
    for name in args.configs:
        ways = {w: (lambda on=on: switch(on)) for w, on in WAYS.items()}
        trainer, _, seconds, grads = micro_batch_ab(name, ways, args.reps)
        switch(True)
        before, after = (statistics.median(seconds[w]) for w in WAYS)
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        same = "yes" if same_gradients(*grads.values()) else "NO"
        lines.append(table_row(name, trainer.precision.name, *runs, f"{after / before:.3f}", same))
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
