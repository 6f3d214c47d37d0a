"""The lean decode step's elementwise work between the products through torch's ops against the C passes that give
their bits (rlvr.rollout.engines.hf.native_rotary: rotating q and k and writing k and v into the KV buffers, where
the attention runs through the C kernel; native_norm: the residual add, RMSNorm and bf16 cast; rlvr.models.native_swiglu:
the MLP's bf16 SwiGLU), in one process
(bench/generation_ab.py: one Trainer on a bench/floor.py config, one training step, then the same generation `reps`
times per way, alternating). The two ways must give the same tokens and log-probs: checked here too.

    cd bench && python native_passes_ab.py B E J L F --reps 6 --out results/native_passes_amx.md && cd ..
    cd bench && python native_passes_ab.py B L --only norm --reps 6          # one pass switched, the others on
"""

from __future__ import annotations

import argparse
import sys

import rlvr.models.native_swiglu as native_swiglu
import rlvr.models.native_norm as native_norm
import rlvr.rollout.engines.hf.native_rotary as native_rotary
from generation_ab import bit_for_bit_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["B", "L"])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--only", choices=["rotary", "norm", "swiglu"], help="switch this pass alone (the others stay on)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    built = native_rotary.available

    def switch(on: bool) -> None:
        if args.only in (None, "rotary"):
            native_rotary.available = built if on else (lambda: False)
        if args.only in (None, "norm"):
            native_norm.ON = on
        if args.only in (None, "swiglu"):
            native_swiglu.ON = on

    ways = {"torch ops": lambda: switch(False), "C passes": lambda: switch(True)}
    title = f"The lean decode step's elementwise work: torch's ops vs C passes ({args.only or 'rotary, norm and SwiGLU'})"
    bit_for_bit_table(title, f"cd bench && python native_passes_ab.py {' '.join(sys.argv[1:])}", ways, args.configs, args.reps, args.out)


if __name__ == "__main__":
    main()
