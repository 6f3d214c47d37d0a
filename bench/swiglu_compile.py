"""The training forward's SwiGLU (silu(gate) x up, Llama-family MLPs) forward + backward, eager against one kernel per
direction from torch.compile (inductor, dynamic shapes: one compile for every micro-batch shape). A lead for the
training step's non-matmul time, not used by rlvr: eager runs silu, the product and three backward ops, each a pass
over [tokens, intermediate] at memory speed; fused, the forward reads gate and up once and the backward reads the
output's gradient, gate and up once. Shapes: bench/floor.py's training micro-batches (F: 64 rows x 48 completion
tokens and 4 prompts x 259 tokens at intermediate 864; B: 64 x 64 at 1376). fp32, 2 threads, best of 5 rounds, the
two ways alternating (machine_cache.fastest_times).

    python bench/swiglu_compile.py --out bench/results/swiglu_compile_intel.md
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import emit, result_head, table_row  # noqa: E402

from rlvr.models.machine_cache import fastest_times  # noqa: E402

SHAPES = {"F completions": (64, 48, 864), "F prompts": (4, 259, 864), "B completions": (64, 64, 1376), "F longer": (64, 61, 864)}


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def forward_backward(fn, gate, up, grad) -> None:
    gate.grad = up.grad = None
    fn(gate, up).backward(grad)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    compiled = torch.compile(swiglu, dynamic=True)
    lines = result_head(
        "SwiGLU forward + backward: eager vs torch.compile (a lead, not used by rlvr)",
        f"python bench/swiglu_compile.py {' '.join(sys.argv[1:])}",
        "fp32; best of 5 rounds, the ways alternating.",
        ["shape", "eager ms", "compiled ms", "compiled / eager", "first call s", "forward bits equal", "gradients max diff"],
    )
    for name, shape in SHAPES.items():
        gate, up = torch.randn(*shape, requires_grad=True), torch.randn(*shape, requires_grad=True)
        grad = torch.randn(*shape)
        t = time.perf_counter()
        forward_backward(compiled, gate, up, grad)
        first = time.perf_counter() - t
        ways = [functools.partial(forward_backward, f, gate, up, grad) for f in (swiglu, compiled)]
        eager, fused = (1e3 * seconds for seconds in fastest_times(ways))
        forward_backward(swiglu, gate, up, grad)
        expected = (gate.grad.clone(), up.grad.clone())
        forward_backward(compiled, gate, up, grad)
        same = torch.equal(swiglu(gate, up), compiled(gate, up))
        diff = max(float((a - b).abs().max()) for a, b in zip(expected, (gate.grad, up.grad)))
        times = (f"{eager:.2f}", f"{fused:.2f}", f"{fused / eager:.2f}", f"{first:.1f}")
        lines.append(table_row(f"{name} {list(shape)}", *times, same, f"{diff:.1e}"))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
