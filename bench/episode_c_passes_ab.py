"""Multi-turn episodes through lean_decode's step: the torch ways against the C passes (rlvr.rollout.engines.hf.
episode_cache), in one process (bench/generation_ab.py: one Trainer on a bench/floor.py config, one training step, then
the same generation `reps` times per way, alternating):
  * NATIVE_WRITES: q and k rotated and k and v written at each token's slot in one pass (native_rotary);
  * NATIVE_STEP: a one-token step's attention over the rows in it alone, each read to its own length (the C kernel's
    way: native_attention with rows and lengths) instead of over a mask built per step; the same bits;
  * NATIVE_CHUNKS: a tool result's chunk the same way, each token a query read to its own slot, instead of the
    explicit products over the rows' copies (another order of sums: rounding apart); with both, the buffers hold every
    slot from the start instead of growing kv_buffers.GROW at a time.

    cd bench && python episode_c_passes_ab.py H --reps 10 --out results/episode_c_passes_amd.md && cd ..
    cd bench && python episode_c_passes_ab.py H --flags NATIVE_STEP --reps 10    # only that flag on in the second way
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import rlvr.rollout.engines.hf.episode_cache as episode_cache
from _report import emit, result_head, table_row
from generation_ab import generation_ab

FLAGS = ("NATIVE_WRITES", "NATIVE_STEP", "NATIVE_CHUNKS")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["H"])
    ap.add_argument("--flags", default=",".join(FLAGS), help="the flags the second way turns on (comma-separated)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    on = args.flags.split(",")
    assert set(on) <= set(FLAGS), f"--flags: some of {FLAGS}"

    def way(flags: list[str]):
        return lambda: [setattr(episode_cache, f, f in flags) for f in FLAGS]

    ways = {"torch": way([]), " + ".join(on): way(on)}
    lines = result_head(
        "Multi-turn episodes: the lean step's torch ways vs its C passes",
        f"cd bench && python episode_c_passes_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config; the same generation {args.reps} times per way, alternating which goes first",
        ["config", *(f"{w} s" for w in ways), "C / torch (medians)", "same tokens", "largest log-prob gap"],
    )
    for name in args.configs:
        _, outputs, seconds = generation_ab(name, ways, args.reps)
        a, b = outputs.values()
        same = all(torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(a, b))
        gap = max(float((x.sampling_logprobs - y.sampling_logprobs).abs().max()) for x, y in zip(a, b)) if same else float("nan")
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in ways]
        m = [statistics.median(seconds[w]) for w in ways]
        lines.append(table_row(name, *runs, f"{m[1] / m[0]:.3f}", same, f"{gap:.1e}"))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
