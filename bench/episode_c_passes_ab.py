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
import sys

import rlvr.rollout.engines.hf.episode_cache as episode_cache
from generation_ab import closeness_table

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
    title = "Multi-turn episodes: the lean step's torch ways vs its C passes"
    command = f"cd bench && python episode_c_passes_ab.py {' '.join(sys.argv[1:])}"
    closeness_table(title, command, ways, args.configs, args.reps, args.out, "C / torch (medians)")


if __name__ == "__main__":
    main()
