"""The decode's KV buffers laid out three ways, timed at decode shapes: what the eager CPU step's growth costs.

The eager CPU decode (rlvr.rollout.engines.hf.lean_decode) keeps each layer's keys and values in buffers [rows, kv heads,
S, D] that grow kv_buffers.GROW slots at a time and are read whole, the slots not yet written masked: a growth copies
the whole cache, and a step reads up to GROW - 1 masked slots per row in vain. The ways here avoid both, at the price of
another memory layout for the attention's reads:
  * whole       the eager step's: buffers of S rounded up to GROW slots, contiguous, masked; plus one growth (a copy of
                every layer's buffers with GROW more slots) every GROW steps, its time / GROW added per step
  * sliced      buffers of the decode's full capacity allocated once, read as their first S slots (a narrow view:
                each row's keys a stride of capacity x D apart)
  * slot-major  one buffer [capacity, rows x kv heads, D] per layer allocated once, its first S slots contiguous, read
                as [rows x kv heads, S, D] views (each key a stride of rows x kv heads x D apart)
Each way runs one step's attention over `--layers` layers of distinct buffers (so that, as in a decode, a layer's
keys and values come from memory where the cache outgrows the caches), as the explicit products (q K^T x scale +
bias, softmax, x V) and as SDPA's flash kernel, the two the decode chooses between (decode_attention.py).

    python bench/kv_layouts.py --out bench/results/kv_layouts_intel.md
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys

import torch
import torch.nn.functional as F

from _report import emit, result_head, table_row
from rlvr.models.cpu_memory import keep_freed_memory
from rlvr.rollout.engines.hf.kv_buffers import GROW, grown
from kv_bandwidth import _seconds

# (name, rows, kv heads, query heads per kv head, head dim, slots read, capacity): configs B, L, H and a qwen3 shape's
# decodes at a few points
SHAPES = [
    ("B, slot 40", 64, 8, 1, 64, 40, 76),
    ("B, slot 72", 64, 8, 1, 64, 72, 76),
    ("L, slot 100", 64, 2, 2, 64, 100, 270),
    ("L, slot 250", 64, 2, 2, 64, 250, 270),
    ("H, slot 150", 64, 4, 1, 32, 150, 250),
    ("qwen3 W, slot 72", 64, 4, 2, 128, 72, 76),
]


def _explicit(q, keys, values, bias, scale: float) -> torch.Tensor:  # q [n, rep, D], keys/values [n, S, D], bias [n, 1, S]
    s = torch.bmm(q, keys.transpose(1, 2)).mul_(scale).add_(bias)
    return torch.bmm(s.softmax(-1), values)


def _flash(q, keys, values, bias, scale: float) -> torch.Tensor:  # the same as [n, 1, rep, D] queries, one head per batch row
    return F.scaled_dot_product_attention(q[:, None], keys[:, None], values[:, None], attn_mask=bias[:, None], scale=scale)[:, 0]


def _step(attend, q, layers, bias, scale: float) -> None:
    for k, v in layers:
        attend(q, k, v, bias, scale)


def _buffers(way: str, n: int, S: int, cap: int, D: int, layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`layers` (keys, values) of S slots read, [n, S, D] each, laid out the way `way` keeps them."""
    if way == "whole":
        grown = -(-S // GROW) * GROW
        return [(torch.randn(n, grown, D), torch.randn(n, grown, D)) for _ in range(layers)]
    if way == "sliced":
        return [(torch.randn(n, cap, D)[:, :S], torch.randn(n, cap, D)[:, :S]) for _ in range(layers)]
    return [(torch.randn(cap, n, D)[:S].transpose(0, 1), torch.randn(cap, n, D)[:S].transpose(0, 1)) for _ in range(layers)]


def _growth(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """One growth of every layer's buffers by GROW slots: the decode's own kv_buffers.grown, on [n, 1, S, D] views."""
    for k, v in layers:
        for buf in (k, v):
            grown(buf[:, None], buf.shape[1] + GROW)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    keep_freed_memory()  # as a run's process does (rlvr.models.cpu_memory): a growth's new buffers from the heap, not fresh pages
    kernels = {"products": _explicit, "flash": _flash}
    columns = ["shape", "rows x kv heads x queries, D", "slots (capacity)", "keys + values MB a step"]
    for kernel in kernels:
        columns += [f"{kernel}: whole + growth ms", f"{kernel}: sliced / whole", f"{kernel}: slot-major / whole"]
    lines = result_head(
        "Decode attention over KV buffers grown and read whole, sliced, or slot-major",
        f"python bench/kv_layouts.py {shlex.join(sys.argv[1:])}",
        f"fp32, {a.layers} layers of distinct buffers per step, medians of {a.reps} steps; growth by {GROW} slots, its copy / {GROW} "
        "in each step's 'whole' time. Ratios below 1: that layout's step is faster than the grown buffers'.",
        columns,
    )
    for name, rows, kv_heads, rep, D, S, cap in SHAPES:
        n, scale = rows * kv_heads, D**-0.5
        q = torch.randn(n, rep, D)
        cells: list = [name, f"{rows} x {kv_heads} x {rep}, {D}", f"{S} ({cap})", f"{a.layers * 2 * n * S * D * 4 / 2**20:.0f}"]
        for attend in kernels.values():
            ms = {}
            for way in ("whole", "sliced", "slot-major"):
                layers = _buffers(way, n, S, cap, D, a.layers)
                bias = torch.zeros(n, 1, layers[0][0].shape[1])
                bias[..., S:] = float("-inf")  # the whole buffers' slots not yet written
                ms[way] = _seconds(functools.partial(_step, attend, q, layers, bias, scale), a.reps) * 1e3
                if way == "whole":
                    ms[way] += _seconds(functools.partial(_growth, layers), 3) * 1e3 / GROW
            cells += [f"{ms['whole']:.2f}", f"{ms['sliced'] / ms['whole']:.2f}", f"{ms['slot-major'] / ms['whole']:.2f}"]
        lines.append(table_row(*cells))
        print(lines[-1], flush=True)
    emit(lines, a.out)


if __name__ == "__main__":
    main()
