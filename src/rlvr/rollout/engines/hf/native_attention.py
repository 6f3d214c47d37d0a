"""The lean decode's attention over its KV buffers as one C kernel (native_attention.c), where it builds.

softmax(q k^T x scale + bias) v and each query's log-sum-exp, for the few queries of each (row, kv head) over slots
0..length-1 of the row's buffers, reading each key and value once (fp32 buffers, or bf16 widened to fp32) and skipping
the slots masked -inf. The eager step's two batched products read the buffers whole at about half the memory's rate;
decode_attention_way times this beside them and keeps the faster (decode_attention.py). Built once per machine by
rlvr.models.native_build; `available()` is False where it cannot be (then the decode keeps its torch ways).
tests/rollout/test_native_attention.py checks it against the explicit products.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from rlvr.models import native_build

SOURCE = Path(__file__).with_name("native_attention.c")
_P, _I = ctypes.c_void_p, ctypes.c_int64
# q, k, v, k's strides (row, head, slot), v's, bias, its row stride, rows, lengths, out, lse, n, H, R, D, length, scale,
# threads
_ARGS = (_P, _P, _P, _I, _I, _I, _I, _I, _I, _P, _I, _P, _P, _P, _P, _I, _I, _I, _I, _I, ctypes.c_float, ctypes.c_int)


@functools.cache
def _kernels() -> dict[torch.dtype, Any] | None:
    names = {torch.float32: "rlvr_attend_f32", torch.bfloat16: "rlvr_attend_bf16"}
    kernels = {dtype: native_build.function(SOURCE, name, _ARGS) for dtype, name in names.items()}
    return None if None in kernels.values() else kernels


def available() -> bool:
    """Whether the kernel is built and loaded in this process (native_build.why_not(SOURCE) says why not)."""
    return _kernels() is not None


def native_attention(
    q: torch.Tensor,  # [n, Hkv, R, D] fp32: the R query heads that read each kv head
    k: torch.Tensor,  # [n, Hkv, S, D] fp32 or bf16, D contiguous (any strides above it)
    v: torch.Tensor,  # [n, Hkv, S, D] as k
    scale: float,
    bias: torch.Tensor | None,  # [n or 1, 1, 1, S] fp32, 0 or -inf (a -inf slot is not read), or None
    length: int,  # slots 0..length-1 are read
    rows: torch.Tensor | None = None,  # [m] int64: query row i reads buffer row rows[i] of k, v (and bias); None: row i
    lengths: torch.Tensor | None = None,  # [m] int64 in 1..length: query row i reads slots 0..lengths[i]-1; None: length
) -> tuple[torch.Tensor, torch.Tensor]:
    """The output [m, Hkv, R, D] and each query's log-sum-exp [m, Hkv, R], fp32, on the CPU (m = n, q's rows; with `rows`
    the buffers may hold more rows than q: multi-turn episodes, whose rows are at lengths of their own)."""
    kernels = _kernels()
    assert kernels is not None, f"the native attention kernel did not build: {native_build.why_not(SOURCE)}"
    n, H, R, D = q.shape
    N = n if rows is None else k.shape[0]  # the buffers' rows
    assert q.dtype == torch.float32 and k.dtype == v.dtype and k.dtype in kernels, (q.dtype, k.dtype, v.dtype)
    assert k.shape[:2] == v.shape[:2] == (N, H) and k.shape[-1] == v.shape[-1] == D and 0 < length <= min(k.shape[2], v.shape[2])
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k.device.type == "cpu"
    for index in (rows, lengths):  # read by the kernel as they are: the caller keeps them in range (a pass over them each call)
        assert index is None or (index.dtype == torch.int64 and index.shape == (n,) and index.is_contiguous())
    q = q.contiguous()
    out, lse = q.new_empty(n, H, R, D), q.new_empty(n, H, R)
    bias_ptr, bias_stride = None, 0
    if bias is not None:
        assert bias.dtype == torch.float32 and bias.shape[-1] >= length and bias.stride(-1) == 1 and bias.shape[0] in (1, N)
        bias_ptr, bias_stride = bias.data_ptr(), bias.stride(0) if bias.shape[0] > 1 else 0
    rows_ptr, lengths_ptr = (None if x is None else x.data_ptr() for x in (rows, lengths))
    kernels[k.dtype](
        q.data_ptr(), k.data_ptr(), v.data_ptr(), *k.stride()[:3], *v.stride()[:3], bias_ptr, bias_stride, rows_ptr,
        lengths_ptr, out.data_ptr(), lse.data_ptr(), n, H, R, D, length, scale, torch.get_num_threads(),
    )  # fmt: skip
    return out, lse
