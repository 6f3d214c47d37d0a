"""Multi-turn episodes: a tool result's chunk forward reading every row's KV buffer in place from the one-token share of
the rows (a quarter) against from a share that grows with the chunk's length (rlvr.rollout.engines.hf.episode_cache.
read_in_place_share), in one process (bench/generation_ab.py: one Trainer on a bench/floor.py config, one training
step, then the same generation `reps` times per way, alternating). The two ways read the same keys and values through
other batch sizes: the same tokens, log-probs to rounding (reported).

    cd bench && python episode_chunks_in_place_ab.py H --reps 12 --out results/episode_chunks_in_place_intel.md && cd ..
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import rlvr.rollout.engines.hf.episode_cache as episode_cache
from _report import emit, result_head, table_row
from generation_ab import generation_ab

WAYS = {
    "one-token share": lambda: setattr(episode_cache, "CHUNKS_BY_LENGTH", False),
    "share by chunk length": lambda: setattr(episode_cache, "CHUNKS_BY_LENGTH", True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["H"])
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = result_head(
        "Episode chunk forwards: in place from a quarter of the rows vs from a share growing with the chunk's length",
        f"cd bench && python episode_chunks_in_place_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config; the same generation {args.reps} times per way, alternating which goes first",
        ["config", *(f"{w} s" for w in WAYS), "by length / one-token (medians)", "same tokens", "largest log-prob gap"],
    )
    for name in args.configs:
        _, outputs, seconds = generation_ab(name, WAYS, args.reps)
        a, b = outputs.values()
        same = all(torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(a, b))
        gap = max(float((x.sampling_logprobs - y.sampling_logprobs).abs().max()) for x, y in zip(a, b)) if same else float("nan")
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        m = [statistics.median(seconds[w]) for w in WAYS]
        lines.append(table_row(name, *runs, f"{m[1] / m[0]:.3f}", same, f"{gap:.1e}"))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
