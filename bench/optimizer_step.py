"""One AdamW step over a bench model's weights, torch's three implementations side by side, in one process:

    python bench/optimizer_step.py /tmp/rlvr_bench/llama25m /tmp/rlvr_bench/llama9m_gqa --out bench/results/optimizer_step_amd.md

per-tensor (foreach=False, torch's CPU default before rlvr asked for fused), foreach, fused (rlvr.training.setup.
make_optimizer's choice, as transformers' Trainer and so TRL run by default with torch >= 2.8). Random gradients,
every trainable weight of the model; each way built fresh, 2 warm-up steps, then the mean of 5 steps, the ways
alternating over 3 rounds, the fastest round reported.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from _report import cpu_name

WAYS = {"per-tensor": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}


def seconds(params: list[torch.Tensor], rounds: int = 3) -> dict[str, float]:
    best = {way: float("inf") for way in WAYS}
    for _ in range(rounds):
        for way, kwargs in WAYS.items():
            opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, **kwargs)
            opt.step(), opt.step()
            start = time.perf_counter()
            for _ in range(5):
                opt.step()
            best[way] = min(best[way], (time.perf_counter() - start) / 5)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--out")
    args = ap.parse_args()
    lines = ["| model | parameters | per-tensor ms | foreach ms | fused ms | fused / per-tensor |", "| --- | --- | --- | --- | --- | --- |"]
    for path in args.models:
        model = AutoModelForCausalLM.from_pretrained(path)
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        s = seconds(params)
        count = sum(p.numel() for p in params)
        row = f"| {path} | {count / 1e6:.1f}M in {len(params)} tensors | " + " | ".join(f"{s[w] * 1e3:.1f}" for w in WAYS)
        lines.append(row + f" | {s['fused'] / s['per-tensor']:.2f} |")
        print(lines[-1], flush=True)
    if args.out:
        head = [
            "# One AdamW step, torch's implementations",
            "",
            f"Command: `python bench/optimizer_step.py {' '.join(args.models)} --out {args.out}`  ",
        ]
        machine = f"Machine: {cpu_name()}; torch {torch.__version__}; {torch.get_num_threads()} threads; fp32 weights and gradients."
        Path(args.out).write_text("\n".join([*head, machine, "", *lines, ""]))


if __name__ == "__main__":
    main()
