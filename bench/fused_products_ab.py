"""The lean decode step's q/k/v and gate/up projections each apart against one product per group
(rlvr.rollout.engines.hf.layer_products.FUSE: on the CPU under bf16 autocast, where the fused product gives the
separate products' bits), in one process (bench/generation_ab.py: one Trainer on a bench/floor.py config, one training
step, then the same generation `reps` times per way, alternating). The two ways must give the same tokens and
log-probs: checked here too. `--shape NAME=JSON` adds a config as bench/floor.py's option does.

    cd bench && python fused_products_ab.py B E F L G --reps 6 --out results/fused_products_amd.md && cd ..
"""

from __future__ import annotations

import argparse
import sys

import floor
import rlvr.rollout.engines.hf.layer_products as layer_products
from generation_ab import bit_for_bit_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["B", "F", "L"])
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=JSON", help="a config of your own (bench/floor.py --shape)")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    configs = [*args.configs, *(floor.add_shape(s) for s in args.shape)]
    ways = {"apart": lambda: setattr(layer_products, "FUSE", False), "fused": lambda: setattr(layer_products, "FUSE", True)}
    title = "The lean decode step's q/k/v and gate/up: apart vs one product each"
    command = f"cd bench && python fused_products_ab.py {' '.join(sys.argv[1:])}"
    bit_for_bit_table(title, command, ways, configs, args.reps, args.out)


if __name__ == "__main__":
    main()
