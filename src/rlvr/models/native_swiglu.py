"""The Llama-family MLP's SwiGLU, silu(gate) x up, in bf16 as one C pass (and its backward as one more).

transformers' MLP computes `down(act_fn(gate(x)) * up(x))`: under bf16 autocast the SiLU and the product are two
passes over bf16 [rows, intermediate] tensors, and in training their backward three more (two products and
silu_backward), autograd keeping SiLU's output besides its input. native_swiglu.c does each direction in one pass
with torch's bits: a bf16 gate has 65536 values, so SiLU's output and silu_backward's sigmoid are looked up in tables
torch computes once per process for all of them (its own exp), and the rest is torch's float arithmetic in torch's
order (tests/models/test_native_swiglu.py checks every bf16 value, and whole models' log-probs and gradients).

`swiglu(act_fn, gate, up)` is the decode step's (no gradient); `swiglu_mlps(model)` swaps the MLP forward of the
training forward (next to norm_rotary.fused_norm_and_rotary), autograd running `SwiGLU` where it applies: bf16 gate
and up on the CPU, a SiLU module (torch's or transformers'), the kernel built (native_build), ON. Everything else runs
transformers' code unchanged.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from rlvr.models import native_build, shared_cast
from rlvr.models.forward_swaps import swapped_forwards
from rlvr.models.native_build import row_stride

SOURCE = Path(__file__).with_name("native_swiglu.c")
ON = True  # False: torch's ops (bench A/Bs)
PLAIN_MLPS = {"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"}  # down(act(gate(x)) * up(x))
# the activations whose forward is F.silu: torch's and transformers' (ACT2FN["silu"])
SILU = {("torch.nn.modules.activation", "SiLU"), ("transformers.activations", "SiLUActivation")}
_P, _I, _B = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


@functools.cache
def _kernels() -> tuple[Any, Any] | None:
    forward = native_build.function(SOURCE, "rlvr_swiglu", (_P, _I, _P, _I, _P, _P, _I, _I, _B))
    backward = native_build.function(SOURCE, "rlvr_swiglu_backward", (_P, _I, _P, _I, _P, _I, _P, _P, _P, _P, _I, _I, _B))
    return None if forward is None or backward is None else (forward, backward)


def _kernel(which: int) -> Any:
    kernels = _kernels()
    assert kernels is not None, f"the native SwiGLU kernel did not build: {native_build.why_not(SOURCE)}"
    return kernels[which]


@functools.cache
def tables() -> tuple[torch.Tensor, torch.Tensor]:
    """(silu, sigmoid) [65536] floats indexed by a bf16 value's bits: its SiLU as F.silu computes it (a bf16 value,
    widened), and silu_backward's sigmoid of it, 1 / (1 + exp(-x)) in float as torch computes it."""
    with torch.autocast("cpu", enabled=False), torch.no_grad():
        every = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)  # bits 0..65535
        return F.silu(every).float(), 1 / (1 + torch.exp(-every.float()))


def is_silu(act_fn) -> bool:
    """Whether act_fn is torch's or transformers' SiLU module, its class's own forward (F.silu)."""
    return (type(act_fn).__module__, type(act_fn).__name__) in SILU and "forward" not in vars(act_fn)


def applies(act_fn, gate: torch.Tensor, up: torch.Tensor) -> bool:
    """Whether the kernel computes act_fn(gate) * up here: a SiLU module (is_silu), gate and up bf16 of one shape on the CPU, each
    a [rows, intermediate] view with the intermediate contiguous, the kernel built."""
    return (
        ON
        and is_silu(act_fn)
        and gate.dtype == up.dtype == torch.bfloat16
        and gate.device.type == up.device.type == "cpu"
        and gate.shape == up.shape
        and type(gate) is type(up) is torch.Tensor
        and row_stride(gate) is not None
        and row_stride(up) is not None
        and not torch.compiler.is_compiling()
        and _kernels() is not None
    )


def _forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    silu, _ = tables()
    out = torch.empty(gate.shape, dtype=torch.bfloat16)
    I = gate.shape[-1]
    rows = gate.numel() // I if I else 0
    threads = torch.get_num_threads()
    _kernel(0)(gate.data_ptr(), row_stride(gate), up.data_ptr(), row_stride(up), silu.data_ptr(), out.data_ptr(), rows, I, threads)
    return out


class SwiGLU(torch.autograd.Function):
    """silu(gate) * up with torch's bits both ways, keeping gate and up (not SiLU's output) for the backward."""

    @staticmethod
    def forward(ctx, gate, up):  # [.., I] bf16 each
        ctx.save_for_backward(gate, up)
        return _forward(gate, up)

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        grad = grad if row_stride(grad) is not None and grad.dtype == torch.bfloat16 else grad.bfloat16().contiguous()
        silu, sigmoid = tables()
        d_gate, d_up = torch.empty(gate.shape, dtype=torch.bfloat16), torch.empty(gate.shape, dtype=torch.bfloat16)
        I = gate.shape[-1]
        _kernel(1)(
            grad.data_ptr(), row_stride(grad), gate.data_ptr(), row_stride(gate), up.data_ptr(), row_stride(up), silu.data_ptr(),
            sigmoid.data_ptr(), d_gate.data_ptr(), d_up.data_ptr(), gate.numel() // I if I else 0, I, torch.get_num_threads(),
        )  # fmt: skip
        return d_gate, d_up


def swiglu(act_fn, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act_fn(gate) * up: through the kernel where it applies (with autograd where a gradient flows), else torch's."""
    if not applies(act_fn, gate, up):
        return act_fn(gate) * up
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return SwiGLU.apply(gate, up)
    return _forward(gate, up)


def _mlp_forward(mlp):
    def forward(x):
        gate, up = shared_cast.outputs(x, (mlp.gate_proj, mlp.up_proj))  # x cast once for both products where it applies
        return mlp.down_proj(swiglu(mlp.act_fn, gate, up))

    return forward


@contextlib.contextmanager
def swiglu_mlps(model) -> Iterator[None]:
    """Inside the block the model's plain Llama-family MLPs compute their SwiGLU through `swiglu` (with transformers'
    bits); outside, transformers' own forward. Not under gradient checkpointing (whose recomputation must save what
    the forward saved) or torch.compile (swiglu leaves it to torch's ops)."""
    from rlvr.models.attention import activation_checkpointing

    if activation_checkpointing(model) or not ON:
        yield
        return
    mlps = [m for m in model.modules() if type(m).__name__ in PLAIN_MLPS and is_silu(getattr(m, "act_fn", None))]
    with swapped_forwards((mlp, _mlp_forward(mlp)) for mlp in mlps):
        yield
