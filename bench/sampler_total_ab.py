"""The sampler's Z as a sum of its own over the kept weights [n, V] against Z taken from the draw's running total
(rlvr.rollout.engines.sampling.Z_FROM_DRAW: inverse_cdf sums the weights in blocks anyway, in float64 over fp32 blocks
of CDF_BLOCK), in one process (bench/generation_ab.py: one Trainer on a bench/floor.py config, one training step, then
the same generation `reps` times per way, alternating). Z rounds differently, so the log-probs and entropies differ by
a few fp32 roundings (reported); the tokens must be the same. `--shape NAME=JSON` adds a config as bench/floor.py's
option does.

    cd bench && python sampler_total_ab.py V Q3 --shape 'Q3={"llama": {...}, ...}' --reps 8 \
        --out results/sampler_total_intel.md && cd ..
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import floor
import rlvr.rollout.engines.sampling as sampling
from _report import emit, result_head, table_row
from generation_ab import generation_ab

WAYS = {
    "Z summed": lambda: setattr(sampling, "Z_FROM_DRAW", False),
    "Z from the draw": lambda: setattr(sampling, "Z_FROM_DRAW", True),
}


def _gap(a, b, field: str) -> float:
    pairs = [(getattr(x, field), getattr(y, field)) for x, y in zip(a, b)]
    return max((float((p - q).abs().max()) for p, q in pairs if p is not None and q is not None), default=float("nan"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["V"])
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=JSON", help="a config of your own (bench/floor.py --shape)")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    for shape in args.shape:
        floor.add_shape(shape)
    lines = result_head(
        "The sampler's Z: a sum of its own over [n, V] vs the draw's running total",
        f"cd bench && python sampler_total_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config; the same generation {args.reps} times per way, alternating which goes first",
        [
            "config",
            *(f"{w} s" for w in WAYS),
            "from the draw / summed (medians)",
            "same tokens",
            "largest log-prob gap",
            "largest entropy gap",
        ],
    )
    for name in args.configs:
        _, outputs, seconds = generation_ab(name, WAYS, args.reps)
        a, b = outputs.values()
        same = all(torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(a, b))
        gaps = [f"{_gap(a, b, f):.1e}" if same else "-" for f in ("sampling_logprobs", "sampling_entropy")]
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        m = [statistics.median(seconds[w]) for w in WAYS]
        lines.append(table_row(name, *runs, f"{m[1] / m[0]:.3f}", same, *gaps))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
