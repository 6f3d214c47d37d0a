"""Two decode-step questions timed alone on this machine (2 threads, machine_cache.fastest_times: best of 5 rounds):

1. attention for one query per row over fp32 key/value buffers [rows, heads, slots, D]: the scores q K^T and the
   output p V each as a batched matmul (the lean decode's explicit products), as einsum, as bmm with the buffer on the
   left (a matrix-vector product per head), as an elementwise multiply and a sum, and SDPA's kernel for both at once;
2. a packed bf16 decode product (rlvr.models.packed_linears' oneDNN weights, cycling through 16 of them as the layers
   do) from an input already in place, from a copy made just before, and from the fp32 input cast to bf16 just before
   (what the decode does: the normed activations are fp32).

    python bench/decode_op_probes.py --out bench/results/decode_op_probes_amx.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from _report import emit, result_head, table_row  # noqa: E402
from rlvr.models.machine_cache import fastest_times  # noqa: E402

ATTENTION_SHAPES = [(64, 8, 40, 64), (64, 8, 72, 64), (64, 2, 264, 64), (64, 12, 72, 64)]  # rows, kv heads, slots, D
PRODUCT_SHAPES = [(64, 512, 512), (64, 512, 1376), (64, 1376, 512)]  # rows, in, out


def attention_ways(n: int, H: int, S: int, D: int) -> dict:
    q, K, V = torch.randn(n, H, 1, D), torch.randn(n, H, S, D), torch.randn(n, H, S, D)
    p = torch.softmax(torch.randn(n, H, 1, S), -1)
    Kf, Vf, qf, pf = K.reshape(n * H, S, D), V.reshape(n * H, S, D), q.reshape(n * H, 1, D), p.reshape(n * H, 1, S)
    return {
        "q K^T matmul": lambda: torch.matmul(q, K.transpose(-1, -2)),
        "q K^T einsum": lambda: torch.einsum("nhqd,nhsd->nhqs", q, K),
        "K q bmm": lambda: torch.bmm(Kf, qf.transpose(1, 2)),
        "q K^T mul+sum": lambda: (K * q).sum(-1),
        "p V matmul": lambda: torch.matmul(p, V),
        "V^T p bmm": lambda: torch.bmm(Vf.transpose(1, 2), pf.transpose(1, 2)),
        "p V mul+sum": lambda: (p.transpose(-1, -2) * V).sum(-2),
        "SDPA (both)": lambda: torch.nn.functional.scaled_dot_product_attention(q, K, V),
    }


def product_ways(rows: int, k: int, n: int) -> dict:
    packed = [torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k).bfloat16(), rows) for _ in range(16)]
    turn = iter(range(2**62))
    x_bf16, x_fp32 = torch.randn(rows, k).bfloat16(), torch.randn(rows, k)

    def product(x):
        return torch.ops.mkldnn._linear_pointwise(x, packed[next(turn) % 16], None, "none", [], "")

    return {
        "input in place": lambda: product(x_bf16),
        "input copied just before": lambda: product(x_bf16.clone()),
        "fp32 input cast just before": lambda: product(x_fp32.to(torch.bfloat16)),
        "the cast alone": lambda: x_fp32.to(torch.bfloat16),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines: list[str] = []
    with torch.inference_mode():
        for i, (n, H, S, D) in enumerate(ATTENTION_SHAPES):
            ways = attention_ways(n, H, S, D)
            if i == 0:
                lines += result_head(
                    "Decode-step probes: attention ways and a product's input",
                    " ".join(["python bench/decode_op_probes.py", *sys.argv[1:]]),
                    "us per call, best of 5 rounds",
                    ["attention: rows, kv heads, slots, D (fp32 K+V MB)", *ways],
                )
            times = fastest_times(list(ways.values()))
            lines.append(table_row(f"{n}, {H}, {S}, {D} ({2 * n * H * S * D * 4 / 1e6:.1f})", *(f"{t * 1e6:.0f}" for t in times)))
        lines.append("")
        for i, (rows, k, n) in enumerate(PRODUCT_SHAPES):
            ways = product_ways(rows, k, n)
            if i == 0:
                lines += [table_row("packed bf16 product: rows, in, out", *ways), table_row(*["---"] * (len(ways) + 1))]
            times = fastest_times(list(ways.values()), rounds=7)
            lines.append(table_row(f"{rows}, {k}, {n}", *(f"{t * 1e6:.1f}" for t in times)))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
