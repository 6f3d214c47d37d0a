"""fp32 generation with the native kernel's q/k/v and gate/up fused for every model (layer_products, since this
change) against fused only where layer_products.fuses(config) says (grouped-query models up to hidden 512: the rule
measured for oneDNN's bf16 products, which the native products followed before), in one process per config.

    python bench/native_fuse_ab.py B E --reps 6 --out bench/results/native_fuse_amd.md

Both ways give the same tokens and log-probs (the native kernel's fused products are its separate products' bits):
the table says so for every run.
"""

from __future__ import annotations

import argparse

import rlvr.rollout.engines.hf.layer_products as layer_products
from generation_ab import bit_for_bit_table

EVERY = layer_products.fused_product


def config_rule(modules, rows, bf16_ok, onednn):  # onednn carries fuses(config)
    return EVERY(modules, rows, bf16_ok, onednn) if onednn else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="*", default=["B", "E"])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out")
    args = ap.parse_args()
    ways = {
        "fuses(config) only": lambda: setattr(layer_products, "fused_product", config_rule),
        "native always": lambda: setattr(layer_products, "fused_product", EVERY),
    }
    command = "python bench/native_fuse_ab.py " + " ".join(args.configs) + f" --reps {args.reps}"
    bit_for_bit_table("fp32 generation: native products fused for every model", command, ways, args.configs, args.reps, args.out)


if __name__ == "__main__":
    main()
