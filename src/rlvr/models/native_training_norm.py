"""The training forward's RMSNorm backward as one C pass (norm_rotary._RMSNorm's, where it builds).

native_training_norm.c computes dx = r (g w - x^ mean(g w x^)) and dw = sum over rows of g x^ (x^ = x r, r the
forward's rstd) in one pass over the rows, where the torch path takes about eight ops over [rows, H] tensors: the same
math in another order, each sum in float with partial sums, as near the float64 gradient as the torch path
(tests/models/test_norm_rotary.py).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from rlvr.models import native_build
from rlvr.models.native_build import row_stride

SOURCE = Path(__file__).with_name("native_training_norm.c")
ON = True  # False: the torch path (bench A/Bs)
_P, _I = ctypes.c_void_p, ctypes.c_int64
# x and its row stride, grad and its row stride, rstd, weight, dx, dw, n, H, threads
_ARGS = (_P, _I, _P, _I, _P, _P, _P, _P, _I, _I, ctypes.c_int)


@functools.cache
def _kernel() -> Any:
    return native_build.function(SOURCE, "rlvr_rms_norm_backward", _ARGS, ctypes.c_int)


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes x [.., H] and weight [H]: fp32 on the CPU, x's rows a view with H contiguous."""
    return (
        ON
        and x.dtype == weight.dtype == torch.float32
        and x.device.type == weight.device.type == "cpu"
        and x.dim() >= 1
        and weight.shape == (x.shape[-1],)
        and row_stride(x) is not None
        and _kernel() is not None
    )


def backward(
    x: torch.Tensor,  # [.., H] fp32, the forward's input
    grad: torch.Tensor,  # [.., H] fp32, the output's gradient
    rstd: torch.Tensor,  # [.., 1] fp32, the forward's (mean(x^2) + eps)^-1/2
    weight: torch.Tensor,  # [H] fp32
    need_x: bool,
    need_weight: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dx [.., H] or None, dweight [H] or None) of y = weight x rstd."""
    H = x.shape[-1]
    if grad.dtype != torch.float32 or row_stride(grad) is None:
        grad = grad.float().contiguous()
    rstd, weight = rstd.contiguous(), weight.contiguous()
    dx = torch.empty(x.shape, dtype=torch.float32) if need_x else None
    dw = torch.empty(H, dtype=torch.float32) if need_weight else None
    failed = _kernel()(
        x.data_ptr(), row_stride(x), grad.data_ptr(), row_stride(grad), rstd.data_ptr(), weight.data_ptr(),
        None if dx is None else dx.data_ptr(), None if dw is None else dw.data_ptr(), x.numel() // H if H else 0, H,
        torch.get_num_threads(),
    )  # fmt: skip
    assert failed == 0, "native RMSNorm backward: no memory for the weight gradient's partial sums"
    return dx, dw
