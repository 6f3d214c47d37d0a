"""One training micro-batch with the training forward's RMSNorm as one C pass (rlvr.models.native_norm.TRAINING), the
grouped prompt attention's queries, keys and values regrouped in one copy each way
(rlvr.models.prefix_attention.REGROUPED), and q/k/v's and gate/up's input cast once under autocast
(rlvr.models.shared_cast.ON), against aten's six norm ops, autograd's cast, reshape and scale, and a cast per product,
in one process. All give the same bits: the table says whether every gradient is bit for bit the same as the first
way's.
One Trainer on a bench/floor.py config, two training steps, then its first micro-batch's forward and backward
`--reps` times per way, alternating the order.

    cd bench && python training_copies_ab.py B E F L J --reps 8 --out results/training_copies_amx.md && cd ..
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
from _floor_step import micro_batch_ab, same_gradients  # noqa: E402
from _report import emit, result_head, table_row  # noqa: E402

WAYS = {
    "before": (False, False, False),
    "norm pass": (True, False, False),
    "regrouped": (False, True, False),
    "shared cast": (False, False, True),
    "all three": (True, True, True),
}


def switch(norm: bool, regrouped: bool, shared: bool) -> None:
    native_norm.TRAINING, prefix_attention.REGROUPED, shared_cast.ON = norm, regrouped, shared


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["B"])
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = result_head(
        "A training micro-batch: the norm's C pass, the regrouped attention inputs and the shared casts vs torch's ops",
        f"cd bench && python training_copies_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config; the same micro-batch {args.reps} times per way, alternating which goes first",
        ["config", "precision", *(f"{w} s" for w in WAYS), *(f"{w} / before (medians)" for w in list(WAYS)[1:])] + ["same gradients"],
    )
    for name in args.configs:
        ways = {w: (lambda on=on: switch(*on)) for w, on in WAYS.items()}
        trainer, _, seconds, grads = micro_batch_ab(name, ways, args.reps)
        switch(True, True, True)
        medians = [statistics.median(seconds[w]) for w in WAYS]
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        ratios = [f"{m / medians[0]:.3f}" for m in medians[1:]]
        same = all(same_gradients(grads["before"], g) for g in grads.values())
        lines.append(table_row(name, trainer.precision.name, *runs, *ratios, str(same)))
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
