"""The training forward's attention over a group's shared prompt, once per group (rlvr.models.prefix_attention) or
repeated for each row (the way before it), inside one process: one Trainer on a bench/floor.py config, one training
step, then that step's first micro-batch (forward + backward, no optimizer step) again under each way in turn,
alternating the order every repetition, so a burst of other work on the machine hits both alike. The ways' gradients
are compared with the first way's as well (they are the same math: equal up to float rounding).

    python bench/prefix_attention_ab.py --configs C,F,K --shape K=JSON --reps 6 --out bench/results/prefix_attention_intel.md
    python bench/prefix_attention_ab.py --configs C,F --ways keys-repeated,grouped --out bench/results/grouped_prefix_bf16_ab_amd.md

Ways: `repeated` (every row's prompt its own, in the pass and the attention), `grouped` (the prompt's pass once per
group, the completions' attention over its keys once per group, also under bf16 autocast), `keys-repeated` (the
prompt's pass once per group, its keys repeated for each row inside the attention under bf16 autocast: `grouped`
before the grouped products ran under bf16; without autocast the same as `grouped`).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import floor  # noqa: E402
from _floor_step import first_micro_batch, floor_step  # noqa: E402
from _report import cpu_name, table_row  # noqa: E402

import rlvr.models.forward as forward  # noqa: E402
from rlvr.models import attention  # noqa: E402

GROUPED = forward._completions_over_grouped_prefix
# way -> (the forward's grouped pass, or None: the repeated prompt; the grouped products under bf16 autocast)
WAYS = {"repeated": (lambda *a: None, True), "grouped": (GROUPED, True), "keys-repeated": (GROUPED, False)}


def run(name: str, ways: list[str], reps: int) -> dict:
    trainer = floor_step(name).trainer
    micro_batch = first_micro_batch(trainer)
    assert micro_batch is not None, f"config {name}: its step trained no rows"
    params = [p for p in trainer.policy.model.parameters() if p.requires_grad]
    seconds: dict[str, list[float]] = {w: [] for w in ways}
    grads: dict[str, list[torch.Tensor]] = {}
    for i in range(reps + 1):  # the first round warms every way up
        for way in ways if i % 2 == 0 else ways[::-1]:
            forward._completions_over_grouped_prefix, attention.GROUPED_UNDER_BF16 = WAYS[way]
            trainer.optimizer.zero_grad(set_to_none=True)
            t = time.perf_counter()
            micro_batch.run()
            if i:
                seconds[way].append(time.perf_counter() - t)
            grads[way] = [p.grad.detach().clone() for p in params]
    forward._completions_over_grouped_prefix, attention.GROUPED_UNDER_BF16 = WAYS["grouped"]
    base = grads[ways[0]]
    scale = max(float(g.abs().max()) for g in base)
    diff = {w: max(float((g - h).abs().max()) for g, h in zip(grads[w], base)) / scale for w in ways[1:]}
    rows = micro_batch.rows.stop - micro_batch.rows.start
    return dict(name=name, rows=rows, precision=trainer.precision.describe(), seconds=seconds, grad_diff=diff)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="C,F,K")
    ap.add_argument("--shape", action="append", default=[], help="NAME=JSON as bench/floor.py's --shape")
    ap.add_argument("--ways", default="repeated,grouped", help=f"two or more of {','.join(WAYS)}, the first the baseline")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default="bench/results/prefix_attention.md")
    args = ap.parse_args()
    ways = args.ways.split(",")
    if len(ways) < 2 or any(w not in WAYS for w in ways):
        ap.error(f"--ways: two or more of {', '.join(WAYS)}, got {args.ways!r}")
    for shape in args.shape:
        floor.add_shape(shape)
    base, others = ways[0], ways[1:]
    lines = [
        f"# Training attention over a shared prompt: {' vs '.join(ways)}",
        "",
        f"Command: `python bench/prefix_attention_ab.py {shlex.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, torch {torch.__version__}, 2 threads. One process per config; the first micro-batch of the",
        f"config's first step, forward + backward, {args.reps} times per way after one warm-up each, alternating the order.",
        "",
        table_row(
            "config",
            "rows",
            "precision",
            *(f"{w} s (median, min)" for w in ways),
            *(f"{w} / {base}" for w in others),
            *(f"{w}: grad diff / max grad" for w in others),
        ),  # fmt: skip
        table_row(*["---"] * (3 + len(ways) + 2 * len(others))),
    ]
    for name in args.configs.split(","):
        r = run(name, ways, args.reps)
        med = {w: statistics.median(ts) for w, ts in r["seconds"].items()}
        print(name, {w: [round(t, 3) for t in ts] for w, ts in r["seconds"].items()}, r["grad_diff"], flush=True)
        precision = r["precision"].split(" (")[0].removeprefix("precision: ")
        cells = [f"{med[w]:.3f}, {min(r['seconds'][w]):.3f}" for w in ways]
        cells += [f"{med[w] / med[base]:.2f}" for w in others] + [f"{r['grad_diff'][w]:.1e}" for w in others]
        lines.append(table_row(name, r["rows"], precision, *cells))
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
