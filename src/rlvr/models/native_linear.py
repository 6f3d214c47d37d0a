"""fp32 decode-shaped products from a weight packed into panels, in C (native_linear.c; one of the ways
rlvr.models.packed_linears measures per shape).

At decode shapes (16-256 rows, a small model's projections) F.linear's kernel and oneDNN's reach a fraction of the
machine's fp32 rate: both spend on each call what a few hundred multiply-adds per output do not repay. native_linear.c
is a plain register-blocked product over a weight packed once (4 rows x 3 vectors of outputs, each panel streamed
whole). Each output is one chain of fused multiply-adds over the input in order (the file's
docstring), so its bits depend on its own row and weight row only: not on the rows in the call, the thread count, the
vector width (AVX2 or AVX-512) or the other weights packed beside it. That makes q/k/v (gate/up) as one packed weight
give each projection its own bits (fused), and a row's outputs the same in a prefill's call as in a decode step's.

Vectors of AVX-512 or AVX2 with FMA where the build's -march has them, else plain C's fmaf (the same chains, the same
bits, far slower: the measurement keeps torch's products there).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any, Sequence

import torch

from rlvr.models import native_build
from rlvr.models.native_build import row_stride

SOURCE = Path(__file__).with_name("native_linear.c")
_P, _I = ctypes.c_void_p, ctypes.c_int64


@functools.cache
def _kernels() -> tuple[Any, Any, int] | None:
    width = native_build.function(SOURCE, "rlvr_linear_panel", (), ctypes.c_int)
    if width is None:
        return None
    pack = native_build.function(SOURCE, "rlvr_linear_pack", (_P, _I, _I, _P, ctypes.c_int))
    product = native_build.function(SOURCE, "rlvr_linear", (_P, _I, _I, _I, _P, _I, _P, _P, _I, ctypes.c_int), ctypes.c_int)
    return pack, product, width()


def available() -> bool:
    """Whether the kernel built here (native_build)."""
    return _kernels() is not None


def pack(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """Weights [out_i, in] (one input size), their outputs side by side in that order, packed for `linear`: a flat fp32
    tensor of ceil(sum(out_i) / W) panels [in, W], W the build's panel width (24 with AVX2, 48 with AVX-512)."""
    kernels = _kernels()
    assert kernels is not None, f"the native linear kernel did not build: {native_build.why_not(SOURCE)}"
    weight = torch.cat([w.detach().float() for w in weights]).contiguous()
    (out_features, in_features), width = weight.shape, kernels[2]
    packed = torch.empty(-(-out_features // width) * in_features * width, dtype=torch.float32)
    kernels[0](weight.data_ptr(), out_features, in_features, packed.data_ptr(), torch.get_num_threads())
    return packed


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [..., in] fp32 (CPU) times the transpose of the weight `pack` made `packed` from, + bias [out_features] fp32
    (contiguous) where given: [..., out_features] fp32, each output the module docstring's chain. (Called per projection
    and decode step: each line here costs a share of a small product's time.)"""
    kernels = _kernels()
    assert kernels is not None
    in_features, width = x.shape[-1], kernels[2]
    if x.dtype != torch.float32 or packed.numel() != -(-out_features // width) * in_features * width:
        raise ValueError(f"native linear: {x.dtype} input [..., {in_features}] for {packed.numel()} packed floats, {out_features} outputs")
    stride = in_features if x.is_contiguous() else row_stride(x)
    if stride is None:
        x, stride = x.contiguous(), in_features
    shape = list(x.shape)
    shape[-1] = out_features
    y = x.new_empty(shape)
    rows = y.numel() // out_features if out_features else 0
    b = None if bias is None else bias.data_ptr()
    threads = torch.get_num_threads()
    kernels[1](x.data_ptr(), stride, rows, in_features, packed.data_ptr(), out_features, b, y.data_ptr(), out_features, threads)
    return y
