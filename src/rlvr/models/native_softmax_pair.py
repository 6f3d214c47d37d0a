"""Softmax over rows split in two dense buffers, and its backward, each one C pass in place (prefix_attention's grouped
products use it where it builds).

The completions' scores over their group's prompt keys ([rows, P]) and over their own keys ([rows, C]) are one softmax
row of P + C. In one buffer the four products that read or write a part see a slice whose rows are P + C apart, and
bf16 products over such slices ran 2-2.5x slower than over dense ones (bench/results/softmax_pair_amx.md); here each
part stays dense and the softmax (and its backward) reads both. The arithmetic is aten's for a bf16 or fp32 softmax:
fp32 throughout, the row's max, exp(x - max), their sum, each exp times its reciprocal, rounded to the buffer's dtype;
the exp is native_lanes.h's (within 2 ulp of expf), so the weights are aten's to a few ulps of fp32 before the rounding
(tests/models/test_softmax_pair.py).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from rlvr.models import native_build

SOURCE = Path(__file__).with_name("native_softmax_pair.c")
ON = True  # False: prefix_attention keeps its one score buffer and aten's softmax (bench A/Bs)
_P, _I, _B = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# a, b, pa, pb, rows, P, C, bf16, backward, starts, bias_b and its u, g, c strides, U, G, R, threads
_ARGS = (_P, _P, _P, _P, _I, _I, _I, _B, _B, _P, _P, _I, _I, _I, _I, _I, _I, _B)
DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def _kernel() -> Any:
    return native_build.function(SOURCE, "rlvr_softmax_pair", _ARGS, ctypes.c_int)


@functools.cache
def vector_bits() -> int:
    """The bits of the build's vectors: 512 (AVX-512), 256 (AVX2), 0 (SSE or another architecture) or -1 (not built)."""
    fn = native_build.function(SOURCE, "rlvr_softmax_pair_vector_bits", (), ctypes.c_int)
    return -1 if fn is None else int(fn())


def applies(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether prefix_attention takes the kernel for scores of this dtype (fp32 or bf16) on this device (the CPU): built
    here with vectors of 256 bits or more (for SSE GCC splits the vectors lane by lane: correct, slower than aten)."""
    return ON and dtype in DTYPES and device.type == "cpu" and _kernel() is not None and vector_bits() >= 256


def _run(a, b, pa=None, pb=None, starts=None, bias_b=None, groups: int = 1, group_size: int = 1, heads: int = 1) -> None:
    P, C = a.shape[-1], b.shape[-1]
    rows = a.numel() // P if P else (b.numel() // C if C else 0)
    for t in (a, b, pa, pb):
        assert t is None or (t.is_contiguous() and t.dtype == a.dtype), "softmax pair: dense buffers of one dtype"
    assert b.numel() == rows * C and (pa is None or (pa.shape == a.shape and pb is not None and pb.shape == b.shape))
    assert rows % (groups * heads * group_size * max(C, 1)) == 0, "softmax pair: rows are [U, Hkv, G, rep x C]"
    R = max(rows // (groups * heads * group_size), 1)  # query rows per (group, kv head, row of the group)
    bu = bg = bc = 0
    if starts is not None:
        assert starts.shape == (groups,) and starts.dtype == torch.int64 and starts.is_contiguous(), "prompt starts: [U] int64"
        assert bool(((starts >= 0) & (starts <= P)).all()), "prompt starts: within the prompt"
    if bias_b is not None:  # [U or 1, G or 1, C, C]: a dim of one broadcast (stride 0)
        assert C > 0 and bias_b.dim() == 4 and bias_b.shape[-2:] == (C, C) and bias_b.stride(-1) == 1 and bias_b.dtype == a.dtype
        assert bias_b.shape[0] in (1, groups) and bias_b.shape[1] in (1, group_size), "own bias: [U or 1, G or 1, C, C]"
        bu, bg = (bias_b.stride(i) if bias_b.shape[i] > 1 else 0 for i in (0, 1))
        bc = bias_b.stride(2)
    backward = pa is not None
    failed = _kernel()(
        a.data_ptr(), b.data_ptr(), pa.data_ptr() if backward else None, pb.data_ptr() if backward else None,
        rows, P, C, a.dtype == torch.bfloat16, backward, None if starts is None else starts.data_ptr(),
        None if bias_b is None else bias_b.data_ptr(), bu, bg, bc, groups, group_size, R, torch.get_num_threads(),
    )  # fmt: skip
    assert failed == 0, "native softmax pair: no memory for a row's buffer"


def softmax_(
    a: torch.Tensor,  # [U, Hkv, G, rep x C, P] scores over the group's prompt keys (any view of those rows), dense
    b: torch.Tensor,  # [U, Hkv, G, rep x C, C] scores over each row's own keys, dense, a's dtype
    prompt_starts: torch.Tensor | None,  # [U] int64: group u's first prompt key; the keys before it weigh 0. None: all count
    own_bias: torch.Tensor | None,  # [U or 1, G or 1, C, C] added to b's rows of group u, row g, position c, or None
    groups: int,  # U
    heads: int,  # Hkv
    group_size: int,  # G
) -> None:
    """[a | b] = softmax([a + prompt mask | b + own_bias], -1) in place: the prompt's keys before a group's start weigh
    0 (aten's softmax over a score plus the dtype's lowest), b + own_bias rounded to the dtype (aten's add_)."""
    _run(a, b, starts=prompt_starts, bias_b=own_bias, groups=groups, group_size=group_size, heads=heads)


def softmax_backward_(da: torch.Tensor, db: torch.Tensor, pa: torch.Tensor, pb: torch.Tensor) -> None:
    """[da | db] = [pa | pb] ([da | db] - sum([da | db] [pa | pb], -1)) in place: the scores' gradient from the
    weights' [da | db] and the forward's weights [pa | pb]."""
    _run(da, db, pa, pb)
