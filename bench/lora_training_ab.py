"""One training micro-batch of a LoRA floor config with peft's LoRA forward against rlvr.models.lora_training's
(the scaling on the adapter's rank-r side), in one process: one Trainer on a bench/floor.py config, two training
steps, then its first micro-batch's forward and backward `--reps` times per way, alternating which goes first.
Each run starts from zeroed gradients; the table says whether the two ways left the same gradients, bit for bit.

    cd bench && python lora_training_ab.py I --reps 6 --out results/lora_training_intel.md && cd ..
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rlvr.models.lora_training as lora_training  # noqa: E402
from _floor_step import micro_batch_ab, same_gradients  # noqa: E402
from _report import emit, result_head, table_row  # noqa: E402

WAYS = {"peft": False, "rank side": True}


def measure(name: str, reps: int) -> tuple[dict[str, list[float]], bool, str]:
    """(seconds per way, same gradients both ways, what ran) for config `name`."""
    ways = {w: (lambda on=on: setattr(lora_training, "RANK_SIDE", on)) for w, on in WAYS.items()}
    trainer, mb, seconds, grads = micro_batch_ab(name, ways, reps)
    lora_training.RANK_SIDE = True
    e = mb.inputs.episodes
    trainable = sum(p.requires_grad for p in trainer.train_model.parameters())
    what = f"{len(range(*mb.rows.indices(e.completion_ids.shape[0])))} rows, {trainable} trainable tensors"
    return seconds, same_gradients(*grads.values()), what


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["I"])
    ap.add_argument("--shape", action="append", default=[], help="NAME=JSON, as bench/floor.py's --shape")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import floor

    for shape in args.shape:
        floor.add_shape(shape)
    lines = result_head(
        "A LoRA training micro-batch: peft's forward vs the scaling on the adapter's rank-r side",
        f"cd bench && python lora_training_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config; the same micro-batch {args.reps} times per way, alternating which goes first",
        ["config", "micro-batch", "peft s", "rank side s", "rank side / peft (medians)", "same gradients"],
    )
    for name in args.configs:
        seconds, same, what = measure(name, args.reps)
        p, r = (statistics.median(seconds[w]) for w in WAYS)
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        lines.append(table_row(name, what, *runs, f"{r / p:.3f}", same))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
