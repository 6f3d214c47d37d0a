"""The lean decode's q/k rotation and KV write through native_rotary's C pass on every attention way, against the torch
ops that the shared layout's flash way (and any way but the C attention kernel's) ran before 2026-12-07, in one process
(bench/generation_ab.py: one Trainer on a bench/floor.py config, one training step, then the same generation `reps`
times per way, alternating). The pass gives the torch ops' bits, so the generations must be the same.

    cd bench && python rotary_pass_ab.py C F --reps 6 --out results/rotary_pass_amx.md && cd ..
"""

from __future__ import annotations

import argparse
import shlex
import sys

import rlvr.rollout.engines.hf.decode_attention as decode_attention
from generation_ab import bit_for_bit_table

FITS = decode_attention._rotary_pass_fits


def _torch_ops() -> None:
    decode_attention._rotary_pass_fits = lambda *a: False


def _c_pass() -> None:
    decode_attention._rotary_pass_fits = FITS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["C", "F"])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    command = "python bench/rotary_pass_ab.py " + shlex.join(sys.argv[1:])
    title = "The decode's rotation and KV write: native_rotary's C pass on every attention way vs the torch ops"
    bit_for_bit_table(title, command, {"torch ops": _torch_ops, "C pass": _c_pass}, args.configs, args.reps, args.out)


if __name__ == "__main__":
    main()
