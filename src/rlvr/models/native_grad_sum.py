"""Several gradients of one tensor summed in float in one C pass, in a given order (shared_cast's backward, where it
builds).

shared_cast hands each product its own view of one cast of an input, so their gradients (bf16 under bf16 autocast)
arrive apart and are summed as autograd would sum their fp32 casts: ((g0 + g1) + g2) .. in float. In torch that is a
cast and an add per gradient, each a pass over the whole tensor, the adds of a bf16 operand into the float total slower
than plain ones; native_grad_sum.c reads each gradient once and writes the total once, with the same float adds in the
same order: the same bits (tests/models/test_shared_cast.py).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any, Sequence

import torch

from rlvr.models import native_build

SOURCE = Path(__file__).with_name("native_grad_sum.c")
ON = True  # False: torch's cast and adds (bench A/Bs)
_ARGS = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int)  # xs, bf16, n, numel, out, threads


@functools.cache
def _kernel() -> Any:
    return native_build.function(SOURCE, "rlvr_grad_sum", _ARGS, ctypes.c_int)


def applies(grads: Sequence[torch.Tensor]) -> bool:
    """Whether the kernel sums these: one shape, each bf16 or fp32 and contiguous, on the CPU, the kernel built."""
    return (
        ON
        and len(grads) > 0
        and all(g.dtype in (torch.float32, torch.bfloat16) and g.device.type == "cpu" and g.is_contiguous() for g in grads)
        and all(g.shape == grads[0].shape for g in grads)
        and _kernel() is not None
    )


def summed(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """((g0 + g1) + g2) .. as a new fp32 tensor of their shape: each widened to float exactly, each sum a float add."""
    n = len(grads)
    out = torch.empty(grads[0].shape, dtype=torch.float32)
    ptrs = (ctypes.c_void_p * n)(*(g.data_ptr() for g in grads))
    bf16 = (ctypes.c_int * n)(*(g.dtype == torch.bfloat16 for g in grads))
    failed = _kernel()(ptrs, bf16, n, out.numel(), out.data_ptr(), torch.get_num_threads())
    assert failed == 0, "native gradient sum: no gradients"
    return out
