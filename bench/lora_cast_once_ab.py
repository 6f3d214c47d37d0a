"""One training micro-batch with each product casting its input itself under bf16 autocast, against one cast shared by
a layer's readers (rlvr.models.shared_cast; with LoRA adapters on every projection, config G, the base and A products
of q/k/v are six readers and of gate/up four), its readers' gradients summed by torch's cast and adds or in one C pass
(rlvr.models.native_grad_sum), and last with a LoRA Linear taking an input already in autocast's dtype (down_proj's,
the bf16 SwiGLU's output) in its adapted forward, where peft cast it to fp32 and autocast back
(rlvr.models.lora_training.AUTOCAST_INPUTS; configs without LoRA time that way twice), in one process: one Trainer on
a bench/floor.py config, two training steps, then its first micro-batch's forward and backward `--reps` times per way,
alternating the order. Every way gives the same bits: the table gives the largest gradient gap against the first
(relative to each tensor's largest entry; 0 is bit for bit).

    cd bench && python lora_cast_once_ab.py G B E F --reps 6 --out results/lora_cast_once_amx.md && cd ..
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rlvr.models.lora_training as lora_training  # noqa: E402
import rlvr.models.native_grad_sum as native_grad_sum  # noqa: E402
import rlvr.models.shared_cast as shared_cast  # noqa: E402
from _floor_step import micro_batch_ab, relative_gap  # noqa: E402
from _report import emit, result_head, table_row  # noqa: E402

WAYS = {
    "a cast per product": (False, False, False),
    "one cast, torch's sums": (True, False, False),
    "one cast, one-pass sum": (True, True, False),
    "and LoRA's bf16 inputs": (True, True, True),
}


def switch(on: tuple[bool, bool, bool]) -> None:
    shared_cast.ON, native_grad_sum.ON, lora_training.AUTOCAST_INPUTS = on


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["G"])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = result_head(
        "A training micro-batch: one input cast for the products that read it (LoRA's base and adapter products too) vs one per product",
        f"cd bench && python lora_cast_once_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config; the same micro-batch {args.reps} times per way, alternating which goes first",
        ["config", "precision", *(f"{w} s" for w in WAYS), *(f"{w} / per product (medians)" for w in list(WAYS)[1:])]
        + ["largest gradient gap"],
    )
    for name in args.configs:
        ways = {w: (lambda on=on: switch(on)) for w, on in WAYS.items()}
        trainer, _, seconds, grads = micro_batch_ab(name, ways, args.reps)
        switch((True, True, True))
        medians = [statistics.median(seconds[w]) for w in WAYS]
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        ratios = [f"{m / medians[0]:.3f}" for m in medians[1:]]
        first, *rest = grads.values()
        gap = max(relative_gap(first, g) for g in rest)
        lines.append(table_row(name, trainer.precision.name, *runs, *ratios, f"{gap:.1e}"))
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
