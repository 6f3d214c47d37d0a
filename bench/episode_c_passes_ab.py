"""Multi-turn episodes through lean_decode's step: the torch ways against the C passes (rlvr.rollout.engines.hf.
episode_cache): NATIVE_WRITES (q and k rotated and k and v written at each row's slot in one pass, the chunks' and the
torch attention's forwards) and NATIVE_STEP (a one-token step's attention over the rows in it alone, each read to its
own length, where the C attention kernel runs), in one process (bench/generation_ab.py: one Trainer on a bench/floor.py
config, one training step, then the same generation `reps` times per way, alternating). The ways must give the same
tokens and log-probs: checked here too.

    cd bench && python episode_c_passes_ab.py H --reps 10 --out results/episode_c_passes_amd.md && cd ..
    cd bench && python episode_c_passes_ab.py H --flags NATIVE_STEP --reps 10    # one flag on, the other off in both ways
"""

from __future__ import annotations

import argparse
import sys

import rlvr.rollout.engines.hf.episode_cache as episode_cache
from generation_ab import bit_for_bit_table

FLAGS = ("NATIVE_WRITES", "NATIVE_STEP")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["H"])
    ap.add_argument("--flags", default=",".join(FLAGS), help="the flags the second way turns on (comma-separated)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    on = args.flags.split(",")
    assert set(on) <= set(FLAGS), f"--flags: one of {FLAGS}"

    def way(flags: list[str]):
        return lambda: [setattr(episode_cache, f, f in flags) for f in FLAGS]

    ways = {"torch": way([]), " + ".join(on): way(on)}
    title = "Multi-turn episodes: the lean step's torch ways vs its C passes"
    bit_for_bit_table(title, f"cd bench && python episode_c_passes_ab.py {' '.join(sys.argv[1:])}", ways, args.configs, args.reps, args.out)


if __name__ == "__main__":
    main()
