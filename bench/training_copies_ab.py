"""One training micro-batch with the training forward's copy-cutting passes against the ops they replace, in one
process: the RMSNorm as one C pass (rlvr.models.native_norm.TRAINING), the grouped prompt attention's queries, keys
and values regrouped in one copy each way (rlvr.models.prefix_attention.REGROUPED), and q/k/v's and gate/up's input
cast once under autocast (rlvr.models.shared_cast.ON). Ways: all off ("before"), each alone, all on. Each gives the
same bits: the table gives each way's largest gradient gap against "before" (relative to each tensor's largest entry;
0 is bit for bit). One Trainer on a bench/floor.py config, two training steps, then its first micro-batch's forward
and backward `--reps` times per way, alternating the order.

    cd bench && python training_copies_ab.py B E F L J G V --reps 8 --out results/training_copies_amx.md && cd ..
    cd bench && python training_copies_ab.py S --shape 'S={"llama": {...}, ...}' --reps 6   # a shape of one's own
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rlvr.models.native_norm as native_norm  # noqa: E402
import rlvr.models.prefix_attention as prefix_attention  # noqa: E402
import rlvr.models.shared_cast as shared_cast  # noqa: E402
import floor  # noqa: E402
from _floor_step import micro_batch_ab, relative_gap  # noqa: E402
from _report import emit, result_head, table_row  # noqa: E402

SWITCHES = {
    "norm pass": (native_norm, "TRAINING"),
    "regrouped": (prefix_attention, "REGROUPED"),
    "shared cast": (shared_cast, "ON"),
}
WAYS = {"before": (), **{name: (name,) for name in SWITCHES}, "all three": tuple(SWITCHES)}


def switch(on: tuple[str, ...]) -> None:
    for name, (module, attr) in SWITCHES.items():
        setattr(module, attr, name in on)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["B"])
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--out", default=None)
    ap.add_argument("--shape", action="append", default=[], help="NAME=JSON, as bench/floor.py's --shape")
    args = ap.parse_args()
    for shape in args.shape:
        floor.add_shape(shape)
    lines = result_head(
        "A training micro-batch: the training forward's norm pass, regrouped attention inputs and shared casts vs the ops they replace",
        f"cd bench && python training_copies_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config; the same micro-batch {args.reps} times per way, alternating which goes first",
        ["config", "precision", *(f"{w} s" for w in WAYS), *(f"{w} / before (medians)" for w in list(WAYS)[1:])]
        + ["largest gradient gap per way"],
    )
    for name in args.configs:
        ways = {w: (lambda on=on: switch(on)) for w, on in WAYS.items()}
        trainer, _, seconds, grads = micro_batch_ab(name, ways, args.reps)
        switch(tuple(SWITCHES))
        medians = [statistics.median(seconds[w]) for w in WAYS]
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        ratios = [f"{m / medians[0]:.3f}" for m in medians[1:]]
        gaps = [relative_gap(grads["before"], grads[w]) for w in list(WAYS)[1:]]
        lines.append(table_row(name, trainer.precision.name, *runs, *ratios, ", ".join(f"{gap:.1e}" for gap in gaps)))
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
