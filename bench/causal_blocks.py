"""Long causal self-attention of the training forward on the CPU, fp32, forward + backward: SDPA (torch's flash kernel,
what rlvr ran there before), rlvr's explicit products in one piece (explicit_attention) and in blocks of query
positions (rlvr.models.causal_attention, what rlvr runs now).

    python bench/causal_blocks.py --out bench/results/causal_blocks_intel.md

Shapes (rows B, query / kv heads, positions L, head size D): bench/floor.py's configs' prompt passes in the
shared-prefix forward (F and K: 4 prompts, C: 8, ~259 tokens) and longer whole rows (the plain forward), each with a
bool mask, causal with left padding on half the rows, as transformers hands the attention function. Best of
`--repeats` after a warm-up; all three in the same process, one shape after another.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from _report import cpu_name  # noqa: E402

from rlvr.models.attention import explicit_attention  # noqa: E402
from rlvr.models.causal_attention import QUERY_ROWS, causal_blocked_attention, query_blocks  # noqa: E402
from rlvr.models.cpu_memory import keep_freed_memory  # noqa: E402

SHAPES = [  # (B, H, Hkv, L, D)
    (4, 8, 2, 259, 40),  # F's prompts
    (4, 6, 2, 259, 64),  # K's
    (8, 8, 8, 259, 64),  # C's
    (16, 8, 2, 512, 40),
    (8, 12, 4, 512, 64),
    (4, 8, 2, 1024, 40),
    (2, 12, 4, 1024, 64),
]


def _inputs(B, H, Hkv, L, D):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, L, D, generator=g, requires_grad=True) for h in (H, Hkv, Hkv))
    pads = torch.tensor([L // 4 if b % 2 else 0 for b in range(B)])
    mask = torch.ones(L, L, dtype=torch.bool).tril()[None] & (torch.arange(L)[None, None] >= pads[:, None, None])
    return q, k, v, mask[:, None]  # [B, 1, L, L]


def _sdpa(q, k, v, mask, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]).transpose(1, 2)


def best_ms(fn, inputs, repeats: int) -> float:
    q, k, v, mask = inputs
    grad = torch.randn(q.shape[0], q.shape[2], q.shape[1], q.shape[3])
    best = float("inf")
    for i in range(repeats + 1):
        t = time.perf_counter()
        out = fn(q, k, v, mask, q.shape[-1] ** -0.5)
        torch.autograd.grad(out, (q, k, v), grad)
        if i:
            best = min(best, (time.perf_counter() - t) * 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "causal_blocks.md"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the Trainer runs on the CPU
    lines = [
        "# Long causal self-attention, fp32 forward + backward: SDPA, explicit products, explicit products in blocks",
        "",
        f"Command: `python bench/causal_blocks.py {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, torch {torch.__version__}, {args.threads} threads. Best of {args.repeats}; a bool mask, causal",
        f"with left padding on half the rows; blocks of {QUERY_ROWS} query rows per kv head.",
        "",
        "| B | H / Hkv | L | D | blocks | SDPA ms | explicit ms | blocks ms | blocks / SDPA | blocks / explicit |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for B, H, Hkv, L, D in SHAPES:
        inputs = _inputs(B, H, Hkv, L, D)
        ms = [best_ms(fn, inputs, args.repeats) for fn in (_sdpa, explicit_attention, causal_blocked_attention)]
        n = len(query_blocks(L, H // Hkv))
        times = " | ".join(f"{t:.1f}" for t in ms)
        row = f"| {B} | {H} / {Hkv} | {L} | {D} | {n} | {times} | {ms[2] / ms[0]:.2f} | {ms[2] / ms[1]:.2f} |"
        print(row, flush=True)
        lines.append(row)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
