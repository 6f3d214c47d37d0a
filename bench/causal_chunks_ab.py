"""The training forward's SDPA calls over chunks of the queries (rlvr.models.attention.causal_sdpa) or as one call.

    python bench/causal_chunks_ab.py --configs L,F,C,H --reps 6 --out bench/results/causal_chunks_avx2.md
    python bench/causal_chunks_ab.py --no-ops --configs L512 --shape 'L512={"llama": {...}, "max_new_tokens": 512}'

Two tables. The op: forward + backward of one causal attention with left padding on half the rows (a bool mask, as
transformers hands SDPA), transformers' SDPA function (one call) against the chunks (chunked_sdpa: causal_sdpa
without its conditions, so also where rlvr keeps one call: a kv head per query head), in fp32 and under bf16
autocast, each way `--reps` times alternating the order after a warm-up; medians, and the largest gap between the two
ways' gradients relative to the largest gradient. The micro-batch: a bench/floor.py config's first micro-batch
(forward + backward) with rlvr.models.attention.CHUNKED off and on (_floor_step.micro_batch_ab), and its gradients'
gap.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
import types
from pathlib import Path

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import floor  # noqa: E402
from _floor_step import micro_batch_ab, relative_gap  # noqa: E402
from _report import cpu_name, table_row  # noqa: E402

from rlvr.models import attention  # noqa: E402

# (rows B, query heads H, kv heads Hkv, queries Lq, keys Lk, head size D): bench/floor.py's prompt passes (F, C), L's
# completions after a 12-token prompt, square rows of 128-1024 and 8 kv heads of 64 (where autograd over the chunks'
# slices had cost more than the chunks saved)
SHAPES = [
    (4, 8, 2, 259, 259, 40),
    (8, 8, 8, 259, 259, 64),
    (64, 4, 2, 256, 268, 64),
    (32, 8, 2, 128, 140, 40),
    (64, 8, 2, 192, 192, 40),
    (64, 8, 8, 256, 256, 64),
    (64, 12, 4, 320, 320, 64),
    (16, 8, 2, 512, 512, 40),
    (2, 12, 4, 1024, 1024, 64),
]


def op_ab(shape: tuple, bf16: bool, reps: int) -> tuple[float, float, float]:
    """(one call ms, chunked ms, gradient gap) for one shape."""
    B, H, Hkv, Lq, Lk, D = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, L, D, generator=g).requires_grad_() for h, L in ((H, Lq), (Hkv, Lk), (Hkv, Lk)))
    pad = torch.zeros(B, Lk, dtype=torch.bool)
    pad[: B // 2, : Lk // 8] = True
    mask = (torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq)[None] & ~pad[:, None, :])[:, None]
    module = types.SimpleNamespace(num_key_value_groups=H // Hkv, is_causal=True)
    ways = {
        "one": lambda: sdpa_attention_forward(module, q, k, v, mask, dropout=0.0, scaling=D**-0.5)[0],
        "chunked": lambda: attention.chunked_sdpa(q, k, v, mask, D**-0.5),  # also where causal_sdpa keeps one call
    }
    times: dict[str, list[float]] = {w: [] for w in ways}
    grads = {}
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        d_out = torch.randn(B, Lq, H, D, generator=g)
        for i in range(reps + 1):
            for w in list(ways) if i % 2 == 0 else list(ways)[::-1]:
                t = time.perf_counter()
                grads[w] = torch.autograd.grad(ways[w](), (q, k, v), d_out)
                if i:
                    times[w].append((time.perf_counter() - t) * 1e3)
    return statistics.median(times["one"]), statistics.median(times["chunked"]), relative_gap(list(grads["one"]), list(grads["chunked"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="L,F,C,H", help="bench/floor.py configs for the micro-batch table ('' for none)")
    ap.add_argument("--shape", action="append", default=[], help="NAME=JSON as bench/floor.py's --shape")
    ap.add_argument("--no-ops", action="store_true", help="the micro-batch table alone")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default="bench/results/causal_chunks.md")
    args = ap.parse_args()
    torch.set_num_threads(2)
    for shape in args.shape:
        floor.add_shape(shape)
    lines = [
        "# The training forward's SDPA over chunks of the queries against one call",
        "",
        f"Command: `python bench/causal_chunks_ab.py {shlex.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, torch {torch.__version__}, 2 threads. Medians of {args.reps} alternating runs a way.",
        "",
    ]
    if not args.no_ops:
        lines += ["## One attention, forward + backward", ""]
        header = ("B, H, Hkv, Lq, Lk, D", "chunks (rlvr's)", "precision", "one call ms", "chunked ms", "chunked / one", "gradient gap")
        lines += [table_row(*header), table_row(*["---"] * 7)]
    for shape in [] if args.no_ops else SHAPES:
        for bf16 in (False, True):
            one, chunked, gap = op_ab(shape, bf16, args.reps)
            n = len(attention.causal_chunks(shape[3], shape[4]))
            n = n if shape[1] >= 2 * shape[2] else f"{n} (1: a kv head per query head)"
            precision = "bf16 autocast" if bf16 else "fp32"
            row = (", ".join(map(str, shape)), n, precision, f"{one:.1f}", f"{chunked:.1f}", f"{chunked / one:.2f}", f"{gap:.1e}")
            print(*row, flush=True)
            lines.append(table_row(*row))
    configs = [c for c in args.configs.split(",") if c]
    if configs:
        lines += ["", "## A floor config's first micro-batch, forward + backward", ""]
        lines += [f"Shapes: {', '.join(args.shape)}", ""] if args.shape else []
        lines += [table_row("config", "precision", "one call s", "chunked s", "chunked / one", "gradient gap"), table_row(*["---"] * 6)]
    for name in configs:
        ways = {"one": lambda: setattr(attention, "CHUNKED", False), "chunked": lambda: setattr(attention, "CHUNKED", True)}
        trainer, _, seconds, grads = micro_batch_ab(name, ways, args.reps)
        one, chunked = statistics.median(seconds["one"]), statistics.median(seconds["chunked"])
        precision = trainer.precision.describe().split(" (")[0].removeprefix("precision: ")
        gap = relative_gap(grads["one"], grads["chunked"])
        row = (name, precision, f"{one:.3f}", f"{chunked:.3f}", f"{chunked / one:.3f}", f"{gap:.1e}")
        print(*row, {w: [round(s, 3) for s in v] for w, v in seconds.items()}, flush=True)
        lines.append(table_row(*row))
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
