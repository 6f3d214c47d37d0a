"""The training forward's attention over a group's shared prompt, once per group (rlvr.models.prefix_attention) or
repeated for each row (the way before it), inside one process: one Trainer on a bench/floor.py config, one training
step, then that step's first micro-batch (forward + backward, no optimizer step) again under each way in turn,
alternating the order every repetition, so a burst of other work on the machine hits both alike. The two ways'
gradients are compared as well (they are the same math: equal up to float rounding).

    python bench/prefix_attention_ab.py --configs C,F,K --shape K=JSON --reps 6 --out bench/results/prefix_attention_intel.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import floor  # noqa: E402
from _floor_step import first_micro_batch, floor_step  # noqa: E402
from _report import cpu_name  # noqa: E402

import rlvr.models.forward as forward  # noqa: E402

GROUPED = forward._completions_over_grouped_prefix
WAYS = {"repeated": lambda *a: None, "grouped": GROUPED}  # None: the forward takes the repeated prompt


def run(name: str, reps: int) -> dict:
    trainer = floor_step(name).trainer
    micro_batch = first_micro_batch(trainer)
    assert micro_batch is not None, f"config {name}: its step trained no rows"
    params = [p for p in trainer.policy.model.parameters() if p.requires_grad]
    seconds: dict[str, list[float]] = {w: [] for w in WAYS}
    grads: dict[str, list[torch.Tensor]] = {}
    for i in range(reps + 1):  # the first round warms both ways up
        for way in list(WAYS) if i % 2 == 0 else list(WAYS)[::-1]:
            forward._completions_over_grouped_prefix = WAYS[way]
            trainer.optimizer.zero_grad(set_to_none=True)
            t = time.perf_counter()
            micro_batch.run()
            if i:
                seconds[way].append(time.perf_counter() - t)
            grads[way] = [p.grad.detach().clone() for p in params]
    forward._completions_over_grouped_prefix = GROUPED
    scale = max(float(g.abs().max()) for g in grads["repeated"])
    diff = max(float((g - h).abs().max()) for g, h in zip(grads["grouped"], grads["repeated"]))
    rows = micro_batch.rows.stop - micro_batch.rows.start
    return dict(name=name, rows=rows, precision=trainer.precision.describe(), seconds=seconds, grad_diff=diff / scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="C,F,K")
    ap.add_argument("--shape", action="append", default=[], help="NAME=JSON as bench/floor.py's --shape")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default="bench/results/prefix_attention.md")
    args = ap.parse_args()
    for shape in args.shape:
        floor.add_shape(shape)
    lines = [
        "# Training attention over a shared prompt: once per group vs repeated per row",
        "",
        f"Command: `python bench/prefix_attention_ab.py {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, torch {torch.__version__}, 2 threads. One process per config; the first micro-batch of the",
        f"config's first step, forward + backward, {args.reps} times per way after one warm-up each, alternating the order.",
        "",
        "| config | rows | precision | repeated s (median, min) | grouped s (median, min) | grouped / repeated | grad diff / max grad |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in args.configs.split(","):
        r = run(name, args.reps)
        rep, grp = r["seconds"]["repeated"], r["seconds"]["grouped"]
        print(name, {w: [round(t, 3) for t in ts] for w, ts in r["seconds"].items()}, f"grad diff {r['grad_diff']:.1e}", flush=True)
        precision = r["precision"].split(" (")[0].removeprefix("precision: ")
        lines.append(
            f"| {name} | {r['rows']} | {precision} | {statistics.median(rep):.3f}, {min(rep):.3f} | "
            f"{statistics.median(grp):.3f}, {min(grp):.3f} | {statistics.median(grp) / statistics.median(rep):.2f} | {r['grad_diff']:.1e} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
