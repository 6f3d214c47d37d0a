"""The rate of the training forward's attention products at a config's shapes, against a Linear-shaped product of the
same FLOPs: why attention over narrow heads costs more than its FLOPs at the matmul floor's rate.

The shared-prompt training attention (rlvr.models.prefix_attention) runs, per layer, six batched products of one
group's completion queries [G x rep x C, D] against the prompt's [P, D] keys/values (forward: scores and output;
backward: four). With D = 40-64 one operand is narrow, and the product runs at a fraction of the rate of the
model's own [tokens, hidden] x [hidden, out] products. Default shapes: bench/floor.py's config F (9M GQA Llama:
4 prompts x 16 completions, 8 query and 2 kv heads of 40, ~259-token prompts, 48 completion tokens).

    python bench/attention_rates.py --out bench/results/attention_rates_intel.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import cpu_name  # noqa: E402


def rate(f, flops: float, reps: int) -> tuple[float, float]:
    for _ in range(3):
        f()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    seconds = (time.perf_counter() - t) / reps
    return seconds * 1e3, flops / seconds / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=8, help="prompts x kv heads (F: 4 x 2)")
    p.add_argument("--queries", type=int, default=3072, help="per prompt and kv head: G x rep x C (F: 16 x 4 x 48)")
    p.add_argument("--keys", type=int, default=259, help="prompt length P")
    p.add_argument("--head-dim", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    B, M, N, D = args.batches, args.queries, args.keys, args.head_dim
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(B, M, D, generator=g), torch.randn(B, N, D, generator=g)
    p_, d_out = torch.randn(B, M, N, generator=g), torch.randn(B, M, D, generator=g)
    scores = torch.empty(B, M, N)
    flops = 2.0 * B * M * N * D
    rows = [
        ("scores q k^T (into a buffer)", lambda: torch.bmm(q, k.transpose(1, 2), out=scores)),
        ("output p v", lambda: torch.bmm(p_, k)),
        ("d_v = p^T d_out", lambda: torch.bmm(p_.transpose(1, 2), d_out)),
        ("d_k = d_s^T q", lambda: torch.bmm(p_.transpose(1, 2), q)),
    ]
    # a product of the same FLOPs at a Linear's shape: [tokens, hidden] x [hidden, hidden]
    side = round((flops / 2) ** (1 / 3) / 64) * 64
    a, w = torch.randn(side, side, generator=g), torch.randn(side, side, generator=g)
    table = ["| product | shape | ms | GFLOP/s |", "| --- | --- | --- | --- |"]
    for name, f in rows:
        ms, gf = rate(f, flops, args.reps)
        table.append(f"| {name} | {B} x [{M} x {N} x {D}] | {ms:.2f} | {gf:.0f} |")
    ms, gf = rate(lambda: torch.mm(a, w), 2.0 * side**3, args.reps)
    table.append(f"| a Linear-shaped product | [{side} x {side}] x [{side} x {side}] | {ms:.2f} | {gf:.0f} |")
    command = "python bench/attention_rates.py " + " ".join(sys.argv[1:])
    machine = f"Machine: {cpu_name()}, {args.threads} threads, torch {torch.__version__}, fp32."
    text = f"Command: `{command}`  \n{machine}\n\n" + "\n".join(table) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
