"""One input cast once for the several products that read it, in the training forward under autocast.

Under bf16 autocast every Linear casts its fp32 input to bf16 itself: the attention's q, k and v products each cast
the same normed rows, the MLP's gate and up too (five passes over [rows, hidden] a layer where two do), and in the
backward each cast's gradient is cast back to fp32 before autograd adds them (five more casts). `shared(x, n, dtype)`
casts x once and hands out n tensors over that one copy, each its own autograd output, so the products' gradients
arrive apart and are summed in fp32 as autograd summed them: the last reader's cast to fp32, the others added to it in
place (a bf16 operand widens inside the add). The forward's values are the same cast's, and the gradient is
autograd's bit for bit: autograd adds each reader's fp32 gradient as it arrives, ((a + b) + c) with c the last to
arrive, the first reader's (q's, through the rotation's backward); a + b is b + a (and sums of a few bf16 values are
exact in fp32 unless their exponents lie far apart). Where native_grad_sum builds, that sum is one C pass with the same
float adds (a cast and an add_ of a bf16 operand per reader were each a pass over the whole tensor).

The MLP's readers are native_swiglu's MLP forward's; the attention's come through `shared_attention_inputs(model)`,
which the training forward enters (rlvr.models.forward): the first of q/k/v_proj called on a tensor casts it for the
three. A peft LoRA Linear (lora_training's adapted forward, its dropout off) is two readers, its base product and A's:
with adapters on every projection a layer's ten casts of the attention's and the MLP's input become two
(bench/results/lora_cast_once_amx.md). tests/models/test_shared_cast.py checks the bits through whole models.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from rlvr.models import lora_training, native_grad_sum
from rlvr.models.forward_swaps import swapped_forwards
from rlvr.models.lora_merge import plain_adapter

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
        if ctx.input_dtype == torch.float32 and native_grad_sum.applies(present):
            return native_grad_sum.summed(present), None, None  # one pass, the same float adds in the same order
        total = present[0].to(ctx.input_dtype, copy=True)
        for g in present[1:]:
            total.add_(g)  # fp32 + bf16 widened: fp32(g1) + fp32(g2), without g2's fp32 copy
        return total, None, None


def shared(x: torch.Tensor, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """n tensors of x cast to dtype once, their gradients summed in x's dtype (module docstring)."""
    return _Shared.apply(x, n, dtype)


def _casts(x: torch.Tensor) -> bool:
    """Whether autocast would cast x for each product: on the CPU to a narrower dtype than x's fp32, in a forward
    with gradients (x itself may need none: the first layer's input under LoRA, the embeddings frozen)."""
    return (
        x.device.type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and x.dtype == torch.float32
        and torch.get_autocast_dtype("cpu") in (torch.bfloat16, torch.float16)
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
    )


def _plan(x: torch.Tensor, modules) -> list[str | None] | None:
    """Per module, how it reads the cast: None for a plain nn.Linear (one copy), the adapter's name for a peft LoRA
    Linear whose base and A products both read it (two copies: lora_training.shared_input_adapter); None overall where
    a module is neither or autocast would not cast x."""
    if not _casts(x):
        return None
    plan = []
    for m in modules:
        adapter = None if type(m) is torch.nn.Linear else lora_training.shared_input_adapter(m, x)
        if type(m) is not torch.nn.Linear and adapter is None:
            return None
        plan.append(adapter)
    return plan


def applies(x: torch.Tensor, modules) -> bool:
    """Whether the products of `modules` reading x take it cast once: under CPU autocast to a narrower dtype than x's
    fp32, in a forward with gradients, each a plain nn.Linear or a LoRA Linear whose two products read x as it is
    (_plan)."""
    return _plan(x, modules) is not None


def _copies(x: torch.Tensor, plan: list[str | None]) -> list[list[torch.Tensor]]:
    """Per module of the plan its views of one cast of x: one for a Linear, two for a LoRA Linear (base, A)."""
    copies = iter(shared(x, sum(1 if a is None else 2 for a in plan), torch.get_autocast_dtype("cpu")))
    return [[next(copies) for _ in range(1 if a is None else 2)] for a in plan]


def _over(module, adapter: str | None, copies: list[torch.Tensor]) -> torch.Tensor:
    """module's output over its views of the one cast."""
    if adapter is None:
        return torch.nn.Linear.forward(module, copies[0])
    return lora_training.adapted(module, adapter, *copies)


def outputs(x: torch.Tensor, modules) -> list[torch.Tensor]:
    """Each module's output of x: over one cast of x where it applies (ON, applies), else each its own forward."""
    plan = _plan(x, modules) if ON else None
    if plan is None:
        return [m(x) for m in modules]
    return [_over(m, a, c) for m, a, c in zip(modules, plan, _copies(x, plan))]


def _reader(module: Any, index: int, readers: tuple, state: dict):
    """module's forward as the index-th of `readers` over one input: the first casts it for all (where it applies)."""
    plain = module.forward  # what was there: the class's forward, or another block's swap (lora_training's)

    def forward(x):
        if index == 0:
            state.clear()
            plan = _plan(x, readers) if ON else None
            if plan is not None:
                state.update(x=x, plan=plan, copies=_copies(x, plan))
        shared_here = state.get("x") is x  # another input: its own cast, as before
        out = _over(module, state["plan"][index], state["copies"][index]) if shared_here else plain(x)
        if index == len(readers) - 1:
            state.clear()
        return out

    return forward


@contextlib.contextmanager
def shared_attention_inputs(model) -> Iterator[None]:
    """Inside the block the q, k and v products of the model's Llama-family attentions (plain Linears or LoRA Linears,
    called in that order on one input) take that input cast once (module docstring); outside, their own forward."""
    from rlvr.models.attention import activation_checkpointing

    swaps: list[tuple[torch.nn.Module, Any]] = []
    # not under gradient checkpointing, as swiglu_mlps: its recomputation runs outside the block
    for attention in [] if activation_checkpointing(model) else model.modules():
        found: tuple[Any, ...] = tuple(getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj"))
        readable = all(type(m) is torch.nn.Linear or plain_adapter(m) is not None for m in found)
        if type(attention).__name__ in ATTENTIONS and readable:
            state: dict = {}  # the three's shared cast, between the first call and the last
            swaps += [(module, _reader(module, index, found, state)) for index, module in enumerate(found)]
    with swapped_forwards(swaps):
        yield
