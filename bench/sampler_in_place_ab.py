"""The sampler with the decode step's logits left whole against the same logits scaled, shifted and clamped in place
(rlvr.rollout.engines.sampling.IN_PLACE: a decode step's logits are read by nothing after its
sample, so sample_tokens(..., overwrite=True) writes x - max x over them, and algo.exp_flushed clamps that at its cut in
place instead of into a copy). In one process (bench/generation_ab.py: one Trainer on a bench/floor.py config, one
training step, then the same generation `reps` times per way, alternating). The two ways must give the same tokens and
log-probs: checked here too. `--shape NAME=JSON` adds a config as bench/floor.py's option does.

    cd bench && python sampler_in_place_ab.py V S B --shape 'S={"llama": {...}, ...}' --reps 8 \
        --out results/sampler_in_place_intel.md && cd ..
"""

from __future__ import annotations

import argparse
import shlex
import sys

import floor
import rlvr.rollout.engines.sampling as sampling
from generation_ab import bit_for_bit_table


def _set(in_place: bool) -> None:
    sampling.IN_PLACE = in_place


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["V", "B"])
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=JSON", help="a config of your own (bench/floor.py --shape)")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    for shape in args.shape:
        floor.add_shape(shape)
    ways = {"logits left whole": lambda: _set(False), "in place": lambda: _set(True)}
    title = "The sampler: the decode step's logits left whole against shifted and clamped in place"
    command = f"cd bench && python sampler_in_place_ab.py {shlex.join(sys.argv[1:])}"
    bit_for_bit_table(title, command, ways, args.configs, args.reps, args.out)


if __name__ == "__main__":
    main()
