"""The training forward's rotary embedding and its backward as one C pass each (norm_rotary._Rotary's, where it builds).

native_training_rotary.c computes per row what norm_rotary.rotate and _Rotary's backward do in four torch ops each,
with their bits: the same two products and one sum in float, no fused multiply-add, bf16 rounded to nearest even as
torch's cast. The forward writes its fp32 output contiguous [B, H, L, D] (attention's reshapes of it are views); the
backward writes the input's gradient in the input's dtype and layout, the cast autograd would make after torch's ops.
tests/models/test_norm_rotary.py checks both against the torch ops, bit for bit.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from rlvr.models import native_build

SOURCE = Path(__file__).with_name("native_training_rotary.c")
ON = True  # False: _Rotary keeps torch's ops (bench A/Bs)
_P, _I, _B = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# in and its strides (b, h, l), whether bf16; cos, sin, their strides (b, l); out and its strides, whether bf16;
# backward; B, H, L, D; threads
_ARGS = (_P, _I, _I, _I, _B, _P, _P, _I, _I, _P, _I, _I, _I, _B, _B, _I, _I, _I, _I, _B)
DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def _kernel() -> Any:
    return native_build.function(SOURCE, "rlvr_rotary", _ARGS, ctypes.c_int)


def applies(x: torch.Tensor, cos: torch.Tensor) -> bool:
    """Whether the kernel takes x [B, H, L, D] (fp32 or bf16, D contiguous, even, at most 512) with cos [B or 1, 1, L, D]
    fp32 (D contiguous), on the CPU, and it built here."""
    D = x.shape[-1]
    return (
        ON
        and x.dim() == 4
        and cos.dim() == 4
        and x.dtype in DTYPES
        and cos.dtype == torch.float32
        and x.device.type == "cpu"
        and D % 2 == 0
        and D <= 512
        and x.stride(-1) == 1
        and cos.stride(-1) == 1
        and cos.shape[1] == 1
        and cos.shape[-2:] == x.shape[-2:]
        and cos.shape[0] in (1, x.shape[0])
        and _kernel() is not None
    )


def _run(src: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, out: torch.Tensor, backward: bool) -> torch.Tensor:
    B, H, L, D = src.shape
    s, o = src.stride(), out.stride()
    c0 = cos.stride(0) if cos.shape[0] > 1 else 0  # one cos for every row: stride 0 broadcasts it
    assert cos.stride() == sin_signed.stride() and cos.shape == sin_signed.shape
    failed = _kernel()(
        src.data_ptr(), s[0], s[1], s[2], src.dtype == torch.bfloat16, cos.data_ptr(), sin_signed.data_ptr(), c0, cos.stride(2),
        out.data_ptr(), o[0], o[1], o[2], out.dtype == torch.bfloat16, backward, B, H, L, D, torch.get_num_threads(),
    )  # fmt: skip
    assert failed == 0, f"native training rotary: head dim {D} is odd or above 512"
    return out


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """norm_rotary.rotate(x, cos, sin_signed): x [B, H, L, D] fp32 or bf16, cos / sin_signed [B or 1, 1, L, D] fp32
    -> [B, H, L, D] fp32, contiguous; the same bits."""
    return _run(x, cos, sin_signed, torch.empty(x.shape, dtype=torch.float32), backward=False)


def unrotate(grad: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, dtype: torch.dtype, strides: tuple) -> torch.Tensor:
    """The rotation's backward, grad cos + roll(grad sin~, D/2) (grad [B, H, L, D] fp32), in the forward input's
    dtype and strides (dense: a view of the projection's output): torch's fp32 sum, cast as autograd casts it."""
    if grad.stride(-1) != 1 or grad.dtype != torch.float32:
        grad = grad.float().contiguous()
    return _run(grad, cos, sin_signed, torch.empty_strided(grad.shape, strides, dtype=dtype), backward=True)
