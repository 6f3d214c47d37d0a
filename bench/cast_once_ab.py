"""The lean decode step's products that read the same input (q, k and v; gate and up), each casting it to the products'
dtype itself against one cast shared by them (rlvr.rollout.engines.hf.lean_decode.CAST_ONCE), in one process
(bench/generation_ab.py: one Trainer on a bench/floor.py config, one training step, then the same generation `reps`
times per way, alternating). The two ways must give the same tokens and log-probs: checked here too.

    cd bench && python cast_once_ab.py B F L G E --reps 6 --out results/cast_once_amd.md && cd ..
"""

from __future__ import annotations

import argparse
import sys

import rlvr.rollout.engines.hf.lean_decode as lean_decode
from generation_ab import bit_for_bit_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["B", "F", "L"])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ways = {"per product": lambda: setattr(lean_decode, "CAST_ONCE", False), "once": lambda: setattr(lean_decode, "CAST_ONCE", True)}
    title = "The lean decode step's shared inputs: cast per product vs once"
    bit_for_bit_table(title, f"cd bench && python cast_once_ab.py {' '.join(sys.argv[1:])}", ways, args.configs, args.reps, args.out)


if __name__ == "__main__":
    main()
