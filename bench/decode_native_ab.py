"""The lean decode's attention with and without the C kernel (rollout.engines.hf.native_attention), each as this
machine's timing chooses it (decode_attention.decode_attention_way with native=False / True), whole generations in
one process per config, alternating which goes first:

    python bench/decode_native_ab.py B,J,L,F 6 --out results/decode_native_ab_amx.md    # from bench/

Per config: each way's seconds, the ratio of medians, the ways chosen, and how close the two generations are (the
kernel sums in another order, and may choose other buffers: the same tokens in most rows, log-probs to float rounding
before a row's first different token).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import rlvr.rollout.engines.hf.decode_attention as da
import rlvr.rollout.engines.hf.episode_decode as ed
import rlvr.rollout.engines.hf.lean_decode as ld
from _report import result_head
from generation_ab import generation_ab


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs")
    ap.add_argument("reps", type=int, nargs="?", default=6)
    ap.add_argument("--out")
    args = ap.parse_args()
    measured = ld.decode_attention_way

    def switch(native: bool) -> None:  # the single-turn decode's choice and the episodes' (multi-turn configs: H)
        way = measured if native else lambda *a, **kw: measured(*a, **{**kw, "native": False})
        for module in (ld, ed):
            module.decode_attention_way = way

    ways = {"torch ways": lambda: switch(False), "with the kernel": lambda: switch(True)}
    lines = result_head(
        "The decode's attention through the C kernel, generation A/B",
        "python bench/decode_native_ab.py " + " ".join(sys.argv[1:]),
        f"one process per config, the same generation {args.reps} times per way, alternating which goes first.",
        [
            "config",
            "precision",
            "torch ways s",
            "with the kernel s",
            "kernel / torch (medians)",
            "ways chosen",
            "same tokens (rows)",
            "max |d logp| before",
        ],
    )
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    for name in args.configs.split(","):
        da._CHOICES.clear()
        trainer, outputs, seconds = generation_ab(name, ways, args.reps)
        ratio = statistics.median(seconds["with the kernel"]) / statistics.median(seconds["torch ways"])
        chosen = "; ".join(
            f"{'native ' if w.native else ''}{'flash ' if w.flash else ''}{'shared' if w.shared else 'repeated'} {str(w.dtype)[6:]}"
            for w in da._CHOICES.values()
        )
        a, b = outputs["torch ways"][0], outputs["with the kernel"][0]
        mask = lambda g: g.completion_mask if hasattr(g, "completion_mask") else g.loss_mask  # noqa: E731  (episodes: loss_mask)
        width = min(a.completion_ids.shape[1], b.completion_ids.shape[1])  # episodes: each run's own width
        a_ids, b_ids = a.completion_ids[:, :width], b.completion_ids[:, :width]
        same = (a_ids == b_ids).all(-1) & (a.completion_ids.shape == b.completion_ids.shape)
        before = ((a_ids != b_ids).cumsum(-1) == 0) & mask(a)[:, :width].bool() & mask(b)[:, :width].bool()
        diff = float((a.sampling_logprobs[:, :width] - b.sampling_logprobs[:, :width])[before].abs().max())
        row = [name, trainer.precision.name, fmt(seconds["torch ways"]), fmt(seconds["with the kernel"]), f"{ratio:.3f}", chosen]
        lines.append("| " + " | ".join([*row, f"{int(same.sum())} of {same.numel()}", f"{diff:.1e}"]) + " |")
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join([*lines, ""]))


if __name__ == "__main__":
    main()
