"""The lean decode step's products that read the same input (q, k and v; gate and up), each casting it to the products'
dtype itself against one cast shared by them (rlvr.rollout.engines.hf.lean_decode.CAST_ONCE), in one process
(bench/generation_ab.py: one Trainer on a bench/floor.py config, one training step, then the same generation `reps`
times per way, alternating). The two ways must give the same tokens and log-probs: checked here too.

    cd bench && python cast_once_ab.py B F L G E --reps 6 --out results/cast_once_amd.md && cd ..
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

import rlvr.rollout.engines.hf.lean_decode as lean_decode
from _report import result_head
from generation_ab import generation_ab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["B", "F", "L"])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ways = {"per product": lambda: setattr(lean_decode, "CAST_ONCE", False), "once": lambda: setattr(lean_decode, "CAST_ONCE", True)}
    lines = result_head(
        "The lean decode step's shared inputs: cast per product vs once",
        f"cd bench && python cast_once_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config, the same generation {args.reps} times per way, alternating which goes first.",
        ["config", "precision", "per product s", "once s", "once / per product (medians)", "same tokens and log-probs"],
    )
    for name in args.configs:
        trainer, outputs, seconds = generation_ab(name, ways, args.reps)
        same = all(
            torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.sampling_logprobs, b.sampling_logprobs)
            for a, b in zip(outputs["per product"], outputs["once"])
        )
        ratio = statistics.median(seconds["once"]) / statistics.median(seconds["per product"])
        fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
        times = f"{fmt(seconds['per product'])} | {fmt(seconds['once'])}"
        lines.append(f"| {name} | {trainer.precision.name} | {times} | {ratio:.3f} | {same} |")
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join([*lines, ""]))


if __name__ == "__main__":
    main()
