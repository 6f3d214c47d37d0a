"""LoRA adapters merged into their base weights while the model generates.

A peft LoRA Linear computes W x + s * B (A x): three products and two elementwise ops per projection,
and in a decode step (one token per row) those small products and peft's Python around them are a
cost of their own (merged, fp32 generation ran 1.08x faster: bench/results/lora_merge.md). Generation needs no
gradients and runs in eval mode (no adapter dropout), so the same function is one product with
W' = W + s * B A. Within `merged_lora_in` every adapted Linear runs that way; outside it the model is
untouched (the training forwards need A and B apart for their gradients).

Only where the products run in fp32 (or fp64): there W' differs from peft's sum by fp32 rounding only
(tests/models/test_lora_merge.py bounds it). In bf16 (autocast, or bf16 weights) W' is rounded to bf16
element by element while the training forward rounds W x and B A x apart: on the tiny model with random
adapters the sampler's log-probs were twice as far from the training forward's (mean gap 0.096 against
0.047 nats), a sampler/trainer mismatch that on-policy GRPO assumes away. So bf16 keeps peft's path.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator, cast

import torch

from rlvr.models.precision import frozen_original

# module -> ((W, A, B) W' was made from, (their _version then, the scaling), W')
_MERGED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def plain_adapter(module: Any) -> str | None:
    """The name of the one adapter of a peft LoRA Linear whose forward is base(x) + scaling * B(A(dropout(x))), with
    base, A and B plain Linears (no bias on A or B); None for anything else (no adapter, several, DoRA and other
    variants, a LoRA bias, a quantised or transposed base)."""
    lora_A: Any = getattr(module, "lora_A", None)
    lora_B: Any = getattr(module, "lora_B", None)
    if not isinstance(lora_A, torch.nn.ModuleDict) or not isinstance(lora_B, torch.nn.ModuleDict):
        return None
    if type(getattr(module, "base_layer", None)) is not torch.nn.Linear or getattr(module, "fan_in_fan_out", True):
        return None
    active = [a for a in getattr(module, "active_adapters", []) if a in lora_A]
    if len(active) != 1 or active[0] in getattr(module, "lora_variant", {}) or getattr(module, "lora_bias", {}).get(active[0]):
        return None
    a = active[0]
    if type(lora_A[a]) is not torch.nn.Linear or type(lora_B[a]) is not torch.nn.Linear:
        return None
    return a if lora_A[a].bias is None and lora_B[a].bias is None else None


def plain_lora(module: Any) -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor, float] | None:
    """(base Linear, A [r, in], B [out, r], scaling) for a peft LoRA Linear whose forward is exactly
    base(x) + scaling * B(A(x)) now: plain_adapter's, with the adapters on, not merged already, no live dropout, and
    plain tensors; None for anything else."""
    a = plain_adapter(module)
    if a is None or getattr(module, "disable_adapters", True) or getattr(module, "merged_adapters", None):
        return None
    if module.lora_dropout[a].training and not isinstance(module.lora_dropout[a], torch.nn.Identity):
        return None  # dropout on the adapter's input: not a linear function of x
    base = module.base_layer
    A, B = cast(torch.Tensor, module.lora_A[a].weight), cast(torch.Tensor, module.lora_B[a].weight)
    if not plain_tensors(base.weight, A, B):
        return None  # a tensor subclass (FSDP's DTensor shard, a quantised weight): W + s B A is not its kind of tensor
    return base, A, B, float(module.scaling[a])


def plain_tensors(*tensors: torch.Tensor) -> bool:
    """Whether each is a plain strided tensor (or Parameter), not a subclass (DTensor, a quantised weight)."""
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided for t in tensors)


@contextlib.contextmanager
def merged_lora_in(model: torch.nn.Module, dtype: torch.dtype, keep: bool = False) -> Iterator[int]:
    """Within the region, each plain LoRA Linear of `model` runs as its base layer with weight W' = W + s * B A
    (in `dtype`) and the adapter marked merged (peft's forward then calls only the base layer); everything is
    as before at exit. Yields how many layers were merged.

    `keep`: W' stays cached after the region and is reused while W, A and B are unchanged (a generation server
    between weight updates); without it W' is freed at exit (a trainer: A and B change before the next region).
    A `dtype` other than fp32 or fp64 merges nothing (the module docstring says why)."""
    if dtype not in (torch.float32, torch.float64):
        yield 0
        return
    swapped: list[tuple[Any, torch.nn.Linear, Any]] = []
    module: Any  # peft's LoRA layers: their attributes are peft's, untyped
    for module in model.modules():
        plan = plain_lora(module)
        if plan is None:
            continue
        base, A, B, scaling = plan
        W = frozen_original(base, "weight")  # fp32, also where a bf16 copy stands in for it (the same W' either way)
        if not plain_tensors(W):
            continue
        sources = (W, A, B)
        state = (W._version, A._version, B._version, scaling)
        kept = _MERGED.get(module)
        if kept is not None and all(x is y for x, y in zip(kept[0], sources)) and kept[1] == state:
            merged = kept[2]
        else:
            with torch.no_grad():
                delta = B.detach().to(dtype) @ A.detach().to(dtype)  # [out, in]
                weight = torch.add(W.detach().to(dtype), delta, alpha=scaling)
            merged = torch.nn.Parameter(weight, requires_grad=False)
            if keep:
                _MERGED[module] = (sources, state, merged)
            else:
                _MERGED.pop(module, None)
        swapped.append((module, base, base._parameters["weight"]))
        base._parameters["weight"] = merged
        module.merged_adapters = [*module.active_adapters]
    try:
        yield len(swapped)
    finally:
        for module, base, weight in swapped:
            base._parameters["weight"] = weight
            module.merged_adapters = []


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype products run in now: autocast's on the model's device when it is on, else the weights' own."""
    p = next(model.parameters())
    device = p.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return p.dtype
