"""fp32 generation with each weight shape's way measured among F.linear and oneDNN's packed product only (as before the
native kernel) against the same measurement with rlvr.models.native_linear among the ways (packed_linears.fp32_way),
in one process per config.

    RLVR_PRECISION_CACHE=/tmp/pc/precision.json python bench/packing_ab.py L F B --reps 6 --out bench/results/X.md

One Trainer on each config (bench/floor.py's configs, fp32 where the machine picks it), one training step, then the
same generation (prompts, seeds) `reps` times per way, alternating which goes first. The two ways round differently
(the native kernel's sums are chains of fused multiply-adds), so their samples part after a while: the table says
whether the tokens stayed the same. The choices measured land in packing.json beside the precision cache (printed).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import rlvr.models.packed_linears as packed_linears
from _report import emit, result_head
from generation_ab import generation_ab
from rlvr.models.machine_cache import precision_cache_path, read_cache


def _switch(ways: tuple[str, ...]):
    def on() -> None:
        packed_linears.fp32_ways = lambda: ways  # type: ignore[assignment]
        packed_linears._FP32_CHOICES.clear()  # read again from packing.json under this way's key

    return on


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="*", default=["L", "F"])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out")
    args = ap.parse_args()
    both = packed_linears.fp32_ways()
    ways = {"oneDNN or F.linear": _switch((packed_linears.ONEDNN,)), "with native": _switch(both)}
    lines = result_head(
        "fp32 decode products: the native kernel among the measured ways",
        "python bench/packing_ab.py " + " ".join(args.configs) + f" --reps {args.reps}",
        f"one process per config, the same generation {args.reps} times per way, alternating which goes first.",
        ["config", "precision", "oneDNN or F.linear s", "with native s", "with / without (medians)", "same tokens"],
    )
    for name in args.configs:
        trainer, outputs, seconds = generation_ab(name, ways, args.reps)
        a, b = outputs.values()
        same = all(torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(a, b))
        first, second = seconds.values()
        ratio = statistics.median(second) / statistics.median(first)
        fmt = ", ".join
        lines.append(
            f"| {name} | {trainer.precision.name} | {fmt(f'{t:.3f}' for t in first)} | {fmt(f'{t:.3f}' for t in second)} "
            f"| {ratio:.3f} | {same} |"
        )
        print(lines[-1], flush=True)
    lines += ["", "The ways each shape took (packing.json; seconds per product alone):", ""]
    for key, entry in read_cache(precision_cache_path().with_name("packing.json")).items():
        k = json.loads(key)
        if k.get("threads") == torch.get_num_threads() and "way" in entry:
            times = ", ".join(f"{w} {entry[f'{w}_s'] * 1e6:.0f} us" for w in ("plain", *k["ways"].split(",")))
            lines.append(f"- {k['in']} -> {k['out']} at {k['rows']} rows, ways {k['ways']}: {entry['way']} ({times})")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
