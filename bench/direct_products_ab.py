"""The lean decode step's projections called as modules (through the packing region's swapped forward) against run
directly from the weights those calls use (rlvr.rollout.engines.hf.compiled_decode.Product), in one process: one Trainer
on a bench/floor.py config, one training step, then the same generation (prompts, seeds) `reps` times per way,
alternating which goes first (bench/generation_ab.py). The two ways must give the same tokens: checked here too.

    python bench/direct_products_ab.py A F H --reps 6     # bench/floor.py configs (H: multi-turn, its episodes)
"""

from __future__ import annotations

import argparse
import statistics

import torch

import rlvr.rollout.engines.hf.lean_decode as lean_decode
from generation_ab import generation_ab

DIRECT = lean_decode.LeanDecoder._products


def _modules(self, n, device):  # every projection called as its module: the step before the direct products
    products = []
    for layer in self.layers:
        attn, mlp = layer.self_attn, layer.mlp
        plain = type(mlp).__name__ in lean_decode.PLAIN_MLPS
        gate_up, down = ((mlp.gate_proj, mlp.up_proj), mlp.down_proj) if plain else ((), None)
        products.append(lean_decode.LayerProducts((attn.q_proj, attn.k_proj, attn.v_proj), attn.o_proj, gate_up, down))
    return [*products, self.lm.lm_head]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["A", "F"])
    ap.add_argument("--reps", type=int, default=6)
    args = ap.parse_args()
    ways = {
        "modules": lambda: setattr(lean_decode.LeanDecoder, "_products", _modules),
        "direct": lambda: setattr(lean_decode.LeanDecoder, "_products", DIRECT),
    }
    for name in args.configs:
        _, outputs, seconds = generation_ab(name, ways, args.reps)
        same = all(torch.equal(a.completion_ids, b.completion_ids) for a, b in zip(outputs["modules"], outputs["direct"]))
        ratio = statistics.median(seconds["direct"]) / statistics.median(seconds["modules"])
        print(f"config {name}: direct / modules {ratio:.2f} (medians), same tokens: {same}", flush=True)


if __name__ == "__main__":
    main()
