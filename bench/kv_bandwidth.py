"""How fast the decode attention's two products read keys and values as the cache outgrows the CPU's caches.

A decode step's attention reads every layer's keys and values once per step (no reuse within the step), so past the
size that stays cached it runs at the rate memory delivers. Here the attention's two batched products at a decode's
shapes (rows x kv heads batches of [rep, D] x [D, S] and [rep, S] x [S, D], as rlvr.rollout.engines.hf.decode_attention
runs them) go over `layers` distinct buffers in turn, as a step goes over its layers, for a growing number of layers:
the time per layer and the bytes of keys and values read per second. Beside it, one sum over a buffer of the same
total size (the machine's plain read rate at that size).

    python bench/kv_bandwidth.py --layers 1,2,4,8,16 --out bench/results/kv_bandwidth_intel.md
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
import time

import torch

from _report import emit, result_head, table_row


def _seconds(fn, reps: int) -> float:
    """Median seconds of fn over `reps` runs after 3 warm-up runs."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def _attend(q: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """One step's attention products over every layer's keys and values [n, S, D], q [n, rep, D]."""
    for k, v in layers:
        torch.bmm(torch.bmm(q, k.transpose(1, 2)).softmax(-1), v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--rep", type=int, default=2, help="query heads per kv head")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--slots", type=int, default=150, help="keys per row and head (the cache's length)")
    ap.add_argument("--layers", default="1,2,4,8,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    n, S, D = a.rows * a.kv_heads, a.slots, a.head_dim
    shape = f"{a.rows} rows x {a.kv_heads} kv heads x {a.rep} queries each, {S} slots of {D}, fp32"
    lines = result_head(
        "Decode attention's products over growing caches",
        f"python bench/kv_bandwidth.py {shlex.join(sys.argv[1:])}",
        f"{shape}; medians of {a.reps} passes over every layer.",
        ["layers", "keys + values MB", "us per layer", "keys + values GB/s", "sum over as many bytes, GB/s"],
    )
    q = torch.randn(n, a.rep, D)
    for layers in [int(x) for x in a.layers.split(",")]:
        keys = [torch.randn(n, S, D) for _ in range(layers)]
        values = [torch.randn(n, S, D) for _ in range(layers)]

        per_layer = _seconds(functools.partial(_attend, q, list(zip(keys, values))), a.reps) / layers
        mb = 2 * n * S * D * 4 / 2**20  # one layer's keys and values
        flat = torch.randn(int(layers * mb * 2**20 / 4))
        sum_rate = layers * mb / 1024 / _seconds(flat.sum, a.reps)
        lines.append(table_row(layers, f"{layers * mb:.0f}", f"{per_layer * 1e6:.0f}", f"{mb / 1024 / per_layer:.1f}", f"{sum_rate:.1f}"))
        print(lines[-1], flush=True)
    emit(lines, a.out)


if __name__ == "__main__":
    main()
