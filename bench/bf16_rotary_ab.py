"""One training micro-batch under bf16 autocast with the rotation of the bf16 q and k as transformers' ops against
rlvr.models.norm_rotary's one autograd node (norm_rotary.BF16_ROTARY), in one process: one Trainer on a
bench/floor.py config, two training steps, then its first micro-batch's forward and backward `--reps` times per way,
alternating which goes first. The forward's bits are the same; the table gives the largest gradient gap (relative to
each tensor's largest entry: the fused backward rounds to bf16 once where transformers' rounds each term).

    cd bench && python bf16_rotary_ab.py B E L --reps 6 --out results/bf16_rotary_amx.md && cd ..
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rlvr.models.norm_rotary as norm_rotary  # noqa: E402
from _floor_step import micro_batch_ab, relative_gap  # noqa: E402
from _report import emit, result_head, table_row  # noqa: E402

WAYS = {"transformers' ops": False, "one node": True}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["B"])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = result_head(
        "A bf16 training micro-batch: the rotation of bf16 q and k as transformers' ops vs one autograd node",
        f"cd bench && python bf16_rotary_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config; the same micro-batch {args.reps} times per way, alternating which goes first",
        ["config", "precision", *(f"{w} s" for w in WAYS), "one node / transformers' (medians)", "largest gradient gap"],
    )
    for name in args.configs:
        ways = {w: (lambda on=on: setattr(norm_rotary, "BF16_ROTARY", on)) for w, on in WAYS.items()}
        trainer, _, seconds, grads = micro_batch_ab(name, ways, args.reps)
        norm_rotary.BF16_ROTARY = True
        before, after = (statistics.median(seconds[w]) for w in WAYS)
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        gap = relative_gap(*grads.values())
        lines.append(table_row(name, trainer.precision.name, *runs, f"{after / before:.3f}", f"{gap:.1e}"))
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
