"""The lean decode step's LoRA projections as peft's module calls against as their three products run directly
(rlvr.rollout.engines.hf.compiled_decode.LoraProduct), in one process (bench/generation_ab.py: one Trainer on a
bench/floor.py config, one training step, then the same generation `reps` times per way, alternating). The two ways
must give the same tokens and log-probs: checked here too.

    cd bench && python lora_products_ab.py G --reps 4 --out results/lora_products_amd.md && cd ..
"""

from __future__ import annotations

import argparse
import sys

import rlvr.rollout.engines.hf.layer_products as layer_products
from generation_ab import bit_for_bit_table

DIRECT = layer_products.lora_product_for


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["G"])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ways = {
        "peft modules": lambda: setattr(layer_products, "lora_product_for", lambda *a: None),
        "direct": lambda: setattr(layer_products, "lora_product_for", DIRECT),
    }
    title = "LoRA projections in the lean decode step: peft's module calls vs their three products directly"
    bit_for_bit_table(title, f"cd bench && python lora_products_ab.py {' '.join(sys.argv[1:])}", ways, args.configs, args.reps, args.out)


if __name__ == "__main__":
    main()
