"""The hf engine's decode loop under torch.inference_mode against no_grad alone, in one process per config:

    cd bench && python inference_mode_ab.py A B V L --reps 6 --out results/inference_mode_intel.md

bench/generation_ab.py's A/B (one training step, then its generation again under each way in turn); the tokens and
log-probs must be the same bits."""

from __future__ import annotations

import argparse

import rlvr.rollout.engines.hf.forward as forward
from generation_ab import bit_for_bit_table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+", help="bench/floor.py configs")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out")
    a = ap.parse_args()
    ways = {
        "no_grad": lambda: setattr(forward, "INFERENCE_MODE", False),
        "inference_mode": lambda: setattr(forward, "INFERENCE_MODE", True),
    }
    command = "cd bench && python inference_mode_ab.py " + " ".join(a.configs) + f" --reps {a.reps}"
    bit_for_bit_table("The decode loop under inference_mode against no_grad", command, ways, a.configs, a.reps, a.out)


if __name__ == "__main__":
    main()
