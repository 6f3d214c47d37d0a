"""The lean decode step's LoRA projections as peft's module calls against as their three products run directly
(rlvr.rollout.engines.hf.compiled_decode.LoraProduct), in one process (bench/generation_ab.py: one Trainer on a
bench/floor.py config, one training step, then the same generation `reps` times per way, alternating). The two ways
must give the same tokens and log-probs: checked here too.

    cd bench && python lora_products_ab.py G --reps 4 --out results/lora_products_amd.md && cd ..
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

DIRECT = lean_decode.lora_product_for


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["G"])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ways = {
        "peft modules": lambda: setattr(lean_decode, "lora_product_for", lambda *a: None),
        "direct": lambda: setattr(lean_decode, "lora_product_for", DIRECT),
    }
    lines = result_head(
        "LoRA projections in the lean decode step: peft's module calls vs their three products directly",
        f"cd bench && python lora_products_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config, the same generation {args.reps} times per way, alternating which goes first.",
        ["config", "peft modules s", "direct s", "direct / modules (medians)", "same tokens and log-probs"],
    )
    for name in args.configs:
        _, outputs, seconds = generation_ab(name, ways, args.reps)
        same = all(
            torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.sampling_logprobs, b.sampling_logprobs)
            for a, b in zip(outputs["peft modules"], outputs["direct"])
        )
        ratio = statistics.median(seconds["direct"]) / statistics.median(seconds["peft modules"])
        fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
        lines.append(f"| {name} | {fmt(seconds['peft modules'])} | {fmt(seconds['direct'])} | {ratio:.3f} | {same} |")
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join([*lines, ""]))


if __name__ == "__main__":
    main()
