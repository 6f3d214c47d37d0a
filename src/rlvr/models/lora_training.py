"""peft LoRA Linears in the training forward with the adapter's scaling on its rank-r side.

peft computes an adapted projection as `W x + B (A x) * s`: the scaling multiplies the [tokens, out] output of B and
the sum is a second [tokens, out] pass, and autograd's backward of that product is a third (the gradient times s). In a
training micro-batch of a 76M Llama with rank-16 adapters in fp32 (bench/floor.py config I, bench/op_times.py) those
passes took about 0.47 s against 0.6 s for all the adapters' own products. The same function with s applied to A x
([tokens, r]) instead (bench/results/lora_training_intel.md):

    y = W x + B ((A x) s)                    under autocast, or in a dtype other than fp32/fp64: one add
    y = addmm(W x, (A x) s, B^T)             fp32/fp64 without autocast: the product accumulates into W x

For a power-of-two s (peft's default alpha = r gives 1; alpha = 2r gives 2) (A x) s is exact, so B ((A x) s) is
exactly s B (A x), and where the addmm's accumulation into W x rounds as a separate add does (it did on the Intel Xeon
measured) y, the loss and every gradient are peft's own bits: tests/models/test_lora_training.py checks both ways bit for bit.
Any other s moves the rounding of one product (within 1e-6 relative in fp32).

`lora_training_forward(model)` swaps this forward in for the block around the training forward, next to
norm_rotary.fused_norm_and_rotary, for each peft LoRA Linear with one plain adapter (no DoRA or other variant, no LoRA
bias, adapters on and not merged; its dropout is applied as peft applies it). Each call checks the rest (not
compiling, plain tensors, no peft call arguments such as adapter_names) and otherwise runs peft's own forward. With
gradients or without: a step's old log-probs (no gradient) take the same formula as the trained ones. Not under
gradient checkpointing: its recomputation runs after the block, in peft's forward. Under bf16 autocast the base and A
products read one cast of the input (shared_cast, through `adapted`) where the adapter's dropout is off, and an
input already bf16 (down_proj's: the SwiGLU's output) takes this forward too, where peft cast it to fp32 for autocast
to cast back (bench/results/lora_cast_once_amx.md).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from rlvr.models.attention import activation_checkpointing
from rlvr.models.forward_swaps import swapped_forwards
from rlvr.models.lora_merge import plain_adapter, plain_tensors

RANK_SIDE = True  # False: peft's forward everywhere (bench/lora_training_ab.py's "before")
AUTOCAST_INPUTS = True  # False: an input in autocast's dtype goes to peft's forward (bench/lora_cast_once_ab.py)


def adapted(module: Any, adapter: str, x: torch.Tensor, x_lora: torch.Tensor) -> torch.Tensor:
    """base(x) + B((A dropout(x_lora)) s): x_lora is x, or (shared_cast) another view of the one cast of x that x is:
    the same products as over x, each of which autocast would have cast to that dtype itself."""
    A, B = module.lora_A[adapter].weight, module.lora_B[adapter].weight
    result = module.base_layer(x)  # [.., out]
    h = F.linear(module.lora_dropout[adapter](x_lora), A) * module.scaling[adapter]  # [.., r]
    wide = result.dtype in (torch.float32, torch.float64) and h.dtype == result.dtype == B.dtype
    if not wide or torch.is_autocast_enabled(x.device.type):
        return result + F.linear(h, B)
    out = torch.addmm(result.reshape(-1, result.shape[-1]), h.reshape(-1, h.shape[-1]), B.t())  # [tokens, out]
    return out.view(result.shape)


def _takes(module: Any, adapter: str, x: torch.Tensor) -> bool:
    """Whether the adapted forward takes x here (else peft's): adapters on and not merged, plain tensors, not compiling."""
    A, B = module.lora_A[adapter].weight, module.lora_B[adapter].weight
    return not (module.disable_adapters or module.merged or torch.compiler.is_compiling() or not plain_tensors(x, A, B))


def _dropout_off(dropout: Any) -> bool:
    """Whether peft's adapter dropout module passes its input through unchanged."""
    return type(dropout) is torch.nn.Identity or (type(dropout) is torch.nn.Dropout and (dropout.p == 0 or not dropout.training))


def _input_dtype_ok(module: Any, adapter: str, x: torch.Tensor) -> bool:
    """x in A's dtype, or in autocast's with the adapter's dropout off (a bf16 SwiGLU's output into down_proj): peft
    casts such an x to A's dtype and autocast casts it back for the product, a round trip that changes no bit (and
    costs two passes over x each way). A live dropout would draw its mask over the wider copy: peft's forward then."""
    A = module.lora_A[adapter].weight
    if x.dtype == A.dtype:
        return True
    if not AUTOCAST_INPUTS:
        return False
    autocast = torch.is_autocast_enabled(x.device.type) and x.dtype == torch.get_autocast_dtype(x.device.type)
    return autocast and A.dtype in (torch.float32, torch.float64) and _dropout_off(module.lora_dropout[adapter])


def _forward(module: Any, adapter: str):
    peft_forward = type(module).forward

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args or kwargs or not _input_dtype_ok(module, adapter, x) or not _takes(module, adapter, x):
            return peft_forward(module, x, *args, **kwargs)
        return adapted(module, adapter, x, x)

    return forward


def shared_input_adapter(module: Any, x: torch.Tensor) -> str | None:
    """The adapter of a peft LoRA Linear whose base and A products may read one cast of x (shared_cast): the adapted
    forward in use (RANK_SIDE, a plain adapter) and taking x now, its dropout off (a live dropout acts on x before any
    cast: A's input is then its own). None otherwise."""
    adapter = plain_adapter(module) if RANK_SIDE else None
    if adapter is None or not _takes(module, adapter, x):
        return None
    return adapter if _dropout_off(module.lora_dropout[adapter]) else None


@contextlib.contextmanager
def lora_training_forward(model: torch.nn.Module) -> Iterator[int]:
    """Inside the block each plain peft LoRA Linear of `model` runs the forward above (module docstring); yields how
    many. Outside, peft's own."""
    if not RANK_SIDE or activation_checkpointing(model):
        yield 0
        return
    adapters = [(module, plain_adapter(module)) for module in model.modules()]
    with swapped_forwards((module, _forward(module, adapter)) for module, adapter in adapters if adapter is not None) as count:
        yield count
