"""The lean decode step's q/k/v and gate/up projections each apart against one product per group
(rlvr.rollout.engines.hf.layer_products.FUSE: on the CPU under bf16 autocast, where the fused product gives the
separate products' bits; fp32 was measured at 9a9ba6b, bench/results/fused_products_fp32_intel.md), in one
process (bench/generation_ab.py: one Trainer on a bench/floor.py config, one training step, then the same
generation `reps` times per way, alternating). The two ways must give the same tokens and log-probs: checked here too.
`--shape NAME=JSON` adds a config as bench/floor.py's option does. `--products`: instead, each way's generation under
torch.profiler, alternating, and the medians of the time in the products and in all ops (the products alone, where
whole generations vary more than the difference). `--every-model`: fused for models without grouped-query attention
or wider than packed_linears.GROUP_MAX_IN too.

    cd bench && python fused_products_ab.py B E F L G --every-model --reps 6 --out results/fused_products_amd.md && cd ..
    cd bench && python fused_products_ab.py L F B --products --every-model && cd ..
"""

from __future__ import annotations

import argparse
import sys

import floor
import rlvr.rollout.engines.hf.layer_products as layer_products
import rlvr.rollout.engines.hf.lean_decode as lean_decode
from generation_ab import bit_for_bit_table


PRODUCT_OPS = {"mkldnn::_linear_pointwise", "aten::addmm", "aten::mm"}  # packed products, F.linear's (fp32 unpacked)


def products_ab(name: str, reps: int) -> None:
    """Medians of the profiled time in the products (oneDNN's from packed weights, F.linear's) and in every op, per
    way, for config `name`."""
    import statistics

    from torch.profiler import ProfilerActivity, profile

    from _floor_step import floor_step

    step, times = floor_step(name), {True: [], False: []}
    for i in range(reps):
        for fuse in (True, False) if i % 2 else (False, True):
            layer_products.FUSE = fuse
            step.generate()  # this way's products built and warm
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step.generate()
            ops = prof.key_averages()
            products = sum(e.self_cpu_time_total for e in ops if e.key in PRODUCT_OPS)
            times[fuse].append((products / 1e3, sum(e.self_cpu_time_total for e in ops) / 1e3))
    for fuse in (False, True):
        med = [statistics.median(t[j] for t in times[fuse]) for j in (0, 1)]
        print(f"{name} {'fused' if fuse else 'apart'}: products {med[0]:.0f} ms, all ops {med[1]:.0f} ms per generation", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["B", "F", "L"])
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=JSON", help="a config of your own (bench/floor.py --shape)")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    ap.add_argument("--products", action="store_true", help="profiled: the time in the products per way")
    ap.add_argument("--every-model", action="store_true", help="fuse every model (not only small grouped-query ones)")
    args = ap.parse_args()
    configs = list(dict.fromkeys([*args.configs, *(floor.add_shape(s) for s in args.shape)]))  # a --shape named in both once
    if args.every_model:
        lean_decode.fuses = lambda config: frozenset({"native", "onednn"} if layer_products.FUSE else ())  # type: ignore[assignment]
    if args.products:
        for name in configs:
            products_ab(name, args.reps)
        return
    ways = {"apart": lambda: setattr(layer_products, "FUSE", False), "fused": lambda: setattr(layer_products, "FUSE", True)}
    title = "The lean decode step's q/k/v and gate/up: apart vs one product each"
    command = f"cd bench && python fused_products_ab.py {' '.join(sys.argv[1:])}"
    bit_for_bit_table(title, command, ways, configs, args.reps, args.out)


if __name__ == "__main__":
    main()
