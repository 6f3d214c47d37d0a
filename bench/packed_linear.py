"""Decode-shaped Linear products alone: F.linear against the same product from a weight packed once for oneDNN
(what rlvr.models.packed_linears runs in generation), bf16 and fp32, at 64 and 16 rows.

    python bench/packed_linear.py --out bench/results/packed_linear.md

Each shape's weights cycle through copies filling ~32 MB (read from memory, as in a decode of a model larger
than the cache); time per product is the best of 5 runs. "diff" is the largest |packed - plain| over one product's
outputs (0: the same bits).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from _report import cpu_name

# (in K, out N): the tiny models', the 9M / 25M / 76M Llamas' (bench/floor.py), LoRA adapters' (r 16), a 49k vocabulary head
SHAPES = [(64, 64), (64, 172), (128, 128), (128, 384), (256, 256), (320, 320), (320, 864), (864, 320), (512, 512),
          (512, 1536), (768, 256), (768, 768), (768, 2048), (2048, 768), (768, 16), (16, 768), (576, 49152)]  # fmt: skip


def best(fn, n: int) -> float:
    for _ in range(3):
        fn()
    out = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out = min(out, (time.perf_counter() - t) / n)
    return out


def measure(K: int, N: int, M: int, dtype: torch.dtype) -> tuple[float, float, float]:
    """(plain us, packed us, max |diff|) per product."""
    copies = max(1, (32 << 20) // (K * N * 4))
    ws = [torch.randn(N, K).to(dtype) for _ in range(copies)]
    x = torch.randn(M, K).to(dtype)
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, M) for w in ws]
    reps = max(2, int(0.05 / max(best(lambda: [F.linear(x, w) for w in ws], 1), 1e-6)))
    plain = best(lambda: [F.linear(x, w) for w in ws], reps) / copies
    fast = best(lambda: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for p in packed], reps) / copies
    diff = (F.linear(x, ws[0]).float() - torch.ops.mkldnn._linear_pointwise(x, packed[0], None, "none", [], "").float()).abs().max()
    return plain * 1e6, fast * 1e6, float(diff)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "packed_linear.md")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lines = [
        "# Decode-shaped products from packed weights",
        "",
        f"Command: `python bench/packed_linear.py --out {a.out}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{cpu_name()}, {a.threads} threads; torch {torch.__version__}). Microseconds per product; x = plain / packed.",
        "",
        "| K x N | bf16, 64 rows: plain / packed (x, diff) | bf16, 16 rows | fp32, 64 rows | fp32, 16 rows |",
        "|---|---|---|---|---|",
    ]
    for K, N in SHAPES:
        cells = []
        for dtype in (torch.bfloat16, torch.float32):
            for M in (64, 16):
                p, q, d = measure(K, N, M, dtype)
                cells.append(f"{p:.1f} / {q:.1f} ({p / q:.2f}x, {d:.2g})")
        lines.append(f"| {K} x {N} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
