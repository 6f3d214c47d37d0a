"""One input cast once for the several products that read it, in the training forward under autocast.

Under bf16 autocast every Linear casts its fp32 input to bf16 itself: the attention's q, k and v products each cast
the same normed rows, the MLP's gate and up too (five passes over [rows, hidden] a layer where two do), and in the
backward each cast's gradient is cast back to fp32 before autograd adds them (five more casts). `shared(x, n, dtype)`
casts x once and hands out n tensors over that one copy, each its own autograd output, so the products' gradients
arrive apart and are summed in fp32 as autograd summed them: the last reader's cast to fp32, the others added to it in
place (a bf16 operand widens inside the add). The forward's values are the same cast's, and the gradient is
autograd's bit for bit: autograd adds each reader's fp32 gradient as it arrives, ((a + b) + c) with c the last to
arrive, the first reader's (q's, through the rotation's backward); a + b is b + a (and sums of a few bf16 values are
exact in fp32 unless their exponents lie far apart).

The MLP's readers are native_swiglu's MLP forward's; the attention's come through `shared_attention_inputs(model)`,
which the training forward enters (rlvr.models.forward): the first of q/k/v_proj called on a tensor casts it for the
three. tests/models/test_shared_cast.py checks the bits through whole models.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from rlvr.models.forward_swaps import swapped_forwards

ATTENTIONS = {"LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention"}  # q/k/v_proj(hidden_states) in that order
ON = True  # False: every product casts its own input (bench A/Bs)


class _Shared(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n: int, dtype: torch.dtype):
        ctx.input_dtype = x.dtype
        copy = x.to(dtype)
        # views of one copy, each an output of its own: autograd hands the backward each reader's gradient apart
        return tuple(copy.view(copy.shape) for _ in range(n))

    @staticmethod
    def backward(ctx, *grads):
        present = [g for g in grads if g is not None][::-1]  # the last reader's first (module docstring)
        total = present[0].to(ctx.input_dtype, copy=True)
        for g in present[1:]:
            total.add_(g)  # fp32 + bf16 widened: fp32(g1) + fp32(g2), without g2's fp32 copy
        return total, None, None


def shared(x: torch.Tensor, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """n tensors of x cast to dtype once, their gradients summed in x's dtype (module docstring)."""
    return _Shared.apply(x, n, dtype)


def applies(x: torch.Tensor, linears) -> bool:
    """Whether the products `linears` reading x take it cast once: under CPU autocast to a narrower dtype than x's fp32,
    a gradient flowing, each a plain nn.Linear (a LoRA layer reads x twice, in dtypes of its own)."""
    return (
        x.device.type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and x.dtype == torch.float32
        and torch.get_autocast_dtype("cpu") in (torch.bfloat16, torch.float16)
        and torch.is_grad_enabled()
        and x.requires_grad
        and all(type(m) is torch.nn.Linear for m in linears)
        and not torch.compiler.is_compiling()
    )


def _reader(linear: Any, index: int, readers: tuple, state: dict):
    """linear's forward as the index-th of `readers` over one input: the first casts it for all (where it applies)."""

    def forward(x):
        if index == 0:
            state.clear()
            if ON and applies(x, readers):
                state.update(x=x, copies=shared(x, len(readers), torch.get_autocast_dtype("cpu")))
        copies = state.get("copies") if state.get("x") is x else None  # another input: its own cast, as before
        if index == len(readers) - 1:
            state.clear()
        return torch.nn.Linear.forward(linear, x if copies is None else copies[index])

    return forward


@contextlib.contextmanager
def shared_attention_inputs(model) -> Iterator[None]:
    """Inside the block the q, k and v products of the model's Llama-family attentions (plain Linears, called in that
    order on one input) take that input cast once (module docstring); outside, their own forward."""
    from rlvr.models.attention import activation_checkpointing

    swaps = []
    # not under gradient checkpointing, as swiglu_mlps: its recomputation runs outside the block
    for attention in [] if activation_checkpointing(model) else model.modules():
        found = [getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj")]
        linears = tuple(m for m in found if type(m) is torch.nn.Linear)
        if type(attention).__name__ in ATTENTIONS and len(linears) == 3:
            state: dict = {}  # the three's shared cast, between the first call and the last
            swaps += [(linear, _reader(linear, index, linears, state)) for index, linear in enumerate(linears)]
    with swapped_forwards(swaps):
        yield
