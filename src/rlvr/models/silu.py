"""The MLP's SiLU in the training forward on the CPU, computed in place on a copy where that is faster.

On an Intel Xeon with torch 2.13's CPU kernels, `silu(x)` into a new tensor runs at a quarter of the rate of
the same kernel writing over its input: a [64, 64, 1376] fp32 activation (a 25M Llama's micro-batch) takes
12.9 ms out of place and 3.2 ms as `silu_(x.clone())`, copy included; its backward `silu_backward(g, x)` 12.9 ms
into a new tensor and 5.8 ms written over a copy of g. Other elementwise ops (exp, tanh, mul) take about 3 ms
either way. Below about a million elements the two ways are level, and above 32 MiB the copy itself is slow
(a fresh allocation that large is new pages, each faulted in on first touch), so only tensors between the two take
the in-place way (bench/results/silu_intel.md). Both ways compute the same bits: the same kernel, only where it
writes differs.

So whether it pays is measured once per machine, dtype and thread count (rlvr.models.machine_cache, silu.json),
forward and backward apart, on a tensor of 2^22 elements; `fast_silu(model)` then swaps the forward of each
SiLU activation module of the model for the block around the training forward (next to
norm_rotary.fused_norm_and_rotary), for CPU tensors of MIN_NUMEL elements to MAX_BYTES outside torch.compile.
Everything else, and every call outside the block, is transformers' own `silu(x)`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F

from rlvr.models.machine_cache import fastest_times, measured_once

MIN_NUMEL = 1 << 20  # below this the two ways measured level (bench/results/silu_intel.md)
MAX_BYTES = 32 << 20  # above this the copy's fresh pages cost more than the in-place kernel saves (glibc maps them anew)
SILU_MODULES = {"SiLUActivation", "SiLU"}  # transformers' ACT2FN["silu"], torch.nn.SiLU: forward is silu(x)
IN_PLACE_AT_MOST = 0.9  # the in-place way is used when it takes at most this share of the plain way's time
_CHOICES: dict[tuple, dict] = {}  # this process's answers of in_place_pays


def in_place_pays(dtype: torch.dtype) -> dict:
    """{"forward": bool, "backward": bool}: whether silu_(x.clone()) beats silu(x), and silu_backward written over
    a copy of the gradient beats it into a new tensor, on this machine (timed once, then read from silu.json)."""
    local = (dtype, torch.get_num_threads())
    if local not in _CHOICES:
        _CHOICES[local] = measured_once("silu", {"dtype": str(dtype).removeprefix("torch."), "numel": 1 << 22}, lambda: _time(dtype))
    return _CHOICES[local]


def _time(dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(0)
    x, grad = torch.randn(2048, 2048, generator=g).to(dtype), torch.randn(2048, 2048, generator=g).to(dtype)
    with torch.no_grad():
        backward = torch.ops.aten.silu_backward
        ways = [lambda: F.silu(x), lambda: _silu_in_place(x), lambda: backward(grad, x), lambda: _backward_in_place(grad, x)]
        f_plain, f_in_place, b_plain, b_in_place = fastest_times(ways, rounds=3)
    return {
        "forward": f_in_place <= IN_PLACE_AT_MOST * f_plain,
        "backward": b_in_place <= IN_PLACE_AT_MOST * b_plain,
        "seconds": {"forward": f_plain, "forward_in_place": f_in_place, "backward": b_plain, "backward_in_place": b_in_place},
    }


def _silu_in_place(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x.clone(), inplace=True)


def _backward_in_place(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    out = grad.clone()  # the incoming gradient is autograd's: never written over
    return torch.ops.aten.silu_backward.grad_input(out, x, grad_input=out)


class _SiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, in_place_backward: bool):
        ctx.save_for_backward(x)
        ctx.in_place_backward = in_place_backward
        return _silu_in_place(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return (_backward_in_place(grad, x) if ctx.in_place_backward else torch.ops.aten.silu_backward(grad, x)), None


def silu(x: torch.Tensor) -> torch.Tensor:
    """silu(x), the same bits, through the in-place kernel where this machine runs it faster (module docstring)."""
    if (
        x.device.type != "cpu"
        or not MIN_NUMEL <= x.numel() <= MAX_BYTES // x.element_size()
        or torch.compiler.is_compiling()
        or type(x) not in (torch.Tensor, torch.nn.Parameter)
    ):
        return F.silu(x)
    pays = in_place_pays(x.dtype)
    if torch.is_grad_enabled() and x.requires_grad:
        return _SiLU.apply(x, pays["backward"]) if pays["forward"] or pays["backward"] else F.silu(x)
    return _silu_in_place(x) if pays["forward"] else F.silu(x)


@contextlib.contextmanager
def fast_silu(model) -> Iterator[None]:
    """Inside the block the model's SiLU activation modules compute `silu` above; outside, transformers' own."""
    modules = [m for m in model.modules() if type(m).__name__ in SILU_MODULES]
    before = [m.__dict__.get("forward") for m in modules]  # an instance's own forward (a nested block's)
    for m in modules:
        m.forward = silu
    try:
        yield
    finally:
        for m, forward in zip(modules, before):
            if forward is None:
                del m.forward
            else:
                m.forward = forward
