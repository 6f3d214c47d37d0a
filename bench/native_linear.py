"""fp32 decode-shaped products alone: F.linear, oneDNN from its packed weight, and rlvr.models.native_linear from its
panels (the three ways rlvr.models.packed_linears measures per shape), at 64, 16 and 256 rows.

    python bench/native_linear.py --out bench/results/native_linear_amd.md

As bench/packed_linear.py: each shape's weights cycle through copies filling ~32 MB (read from memory, as in a decode
of a model larger than the cache); time per product is the best of 5 runs, the ways alternating within each. "native /
best other" is the native kernel's time over the faster of the other two.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from _report import cpu_name
from packed_linear import SHAPES, best
from rlvr.models import native_linear


def measure(K: int, N: int, M: int) -> dict[str, float]:
    """Microseconds per product of each way."""
    copies = max(1, (32 << 20) // (K * N * 4))
    ws = [torch.randn(N, K) for _ in range(copies)]
    x = torch.randn(M, K)
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, M) for w in ws]
    panels = [native_linear.pack([w]) for w in ws]
    ways = {
        "F.linear": lambda: [F.linear(x, w) for w in ws],
        "oneDNN": lambda: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for p in onednn],
        "native": lambda: [native_linear.linear(x, p, None, N) for p in panels],
    }
    reps = max(2, int(0.03 / max(best(ways["F.linear"], 1), 1e-6)))
    times = {w: float("inf") for w in ways}
    for _ in range(3):
        for w, fn in ways.items():
            times[w] = min(times[w], best(fn, reps) / copies * 1e6)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="*", default=[64, 16, 256])
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    assert native_linear.available()
    lines = [
        "# fp32 decode-shaped products: F.linear, oneDNN packed, native panels",
        "",
        f"Command: `python bench/native_linear.py --threads {a.threads} --rows {' '.join(map(str, a.rows))}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu_name()}, {a.threads} threads; torch {torch.__version__}). "
        "Microseconds per product: F.linear / oneDNN / native (native over the faster of the other two).",
        "",
        "| K x N | " + " | ".join(f"{m} rows" for m in a.rows) + " |",
        "|---|" + "---|" * len(a.rows),
    ]
    for K, N in SHAPES:
        cells = []
        for M in a.rows:
            t = measure(K, N, M)
            ratio = t["native"] / min(t["F.linear"], t["oneDNN"])
            cells.append(f"{t['F.linear']:.1f} / {t['oneDNN']:.1f} / {t['native']:.1f} ({ratio:.2f}x)")
        lines.append(f"| {K} x {N} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    if a.out:
        a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
