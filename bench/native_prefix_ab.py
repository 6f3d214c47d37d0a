"""The shared layout's prompt part through native_prefix's C kernel (with the own part through native_attention's) as
one more way decode_attention_way times, against the ways it chose from before, in one process (bench/generation_ab.py:
one Trainer on a bench/floor.py config, one training step, then the same generation `reps` times per way, alternating).
"before": the prefix kernel not offered to the timing; "after": offered (the timing may still choose another way: the
table names the way each chose). The kernel's sums are its own, so the table says whether the generations drew the
same tokens and how far apart their log-probs are where they did.

    cd bench && python native_prefix_ab.py C F --reps 6 --out results/native_prefix_amx.md && cd ..
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys

import torch

import floor
import rlvr.rollout.engines.hf.decode_attention as decode_attention
import rlvr.rollout.engines.hf.lean_decode as lean_decode
from _report import emit, result_head, table_row
from generation_ab import generation_ab

AVAILABLE = decode_attention.prefix_available
WAYS = {"before": False, "after": True}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["C", "F"])
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=JSON", help="a config of your own (bench/floor.py --shape)")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    for shape in args.shape:
        floor.add_shape(shape)
    assert AVAILABLE(), "the prefix kernel does not build here with AVX2 or AVX-512"
    lines = result_head(
        "The shared layout's prompt part through native_prefix's C kernel, offered to the decode's attention timing",
        "python bench/native_prefix_ab.py " + shlex.join(sys.argv[1:]),
        f"one process per config, the same generation {args.reps} times per way, alternating which goes first.",
        ["config", "precision", "before: way", "before s", "after: way", "after s", "after / before (medians)", "same tokens"]
        + ["largest log-prob gap"],
    )
    chosen: dict[str, str] = {}
    start = lean_decode.LeanDecoder.start

    def recording_start(self, *a, **kw):  # the way each decode runs, as the state it starts says
        state = start(self, *a, **kw)
        parts = ["shared" if state.prefix_keys is not None else "repeated", state.own_keys[0].dtype.__str__().removeprefix("torch.")]
        parts += [name for name in ("flash", "native", "native_prefix") if getattr(state, name)]
        chosen[current[0]] = " ".join(parts)
        return state

    current = ["before"]
    lean_decode.LeanDecoder.start = recording_start

    def switch(way: str):
        def on() -> None:
            current[0] = way
            decode_attention.prefix_available = lambda: WAYS[way] and AVAILABLE()

        return on

    for name in args.configs:
        trainer, outputs, seconds = generation_ab(name, {w: switch(w) for w in WAYS}, args.reps)
        a, b = outputs["before"][0], outputs["after"][0]
        same = bool(torch.equal(a.completion_ids, b.completion_ids))
        gap = float((a.sampling_logprobs - b.sampling_logprobs).abs().max()) if same else float("nan")
        med = {w: statistics.median(s) for w, s in seconds.items()}
        fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
        lines.append(table_row(
            name, trainer.precision.name, chosen["before"], fmt(seconds["before"]), chosen["after"], fmt(seconds["after"]),
            f"{med['after'] / med['before']:.3f}", same, f"{gap:.1e}",
        ))  # fmt: skip
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
