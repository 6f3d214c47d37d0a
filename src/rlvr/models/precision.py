"""Mixed precision: bf16 autocast, and whether this CPU runs bf16 matmuls fast (natively)."""

from __future__ import annotations

import contextlib
import functools
import weakref

import torch


def autocast_context(kind: str, device: torch.device, model: torch.nn.Module | None = None):
    """`bf16`: bf16 autocast (matmuls in bf16, weights and optimizer state stay fp32); `none`: nothing.
    `model.autocast=auto` is resolved before any forward (rlvr.models.precision_choice), never here.

    With `model`, on the CPU: its frozen fp32 Linear weights run from bf16 copies kept across regions
    (frozen_linears_in). Only for regions that run the model's forward and write no weight."""
    if kind == "bf16":
        region = torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        if model is None or device.type != "cpu":
            return region
        stack = contextlib.ExitStack()
        stack.enter_context(region)
        stack.enter_context(frozen_linears_in(model, torch.bfloat16))
        return stack
    if kind == "none":
        return contextlib.nullcontext()
    raise ValueError(f"autocast_context takes a resolved precision, 'bf16' or 'none', got {kind!r}")


# module -> {parameter name: (the fp32 parameter, its _version when copied, the bf16 copy)}
_FROZEN_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def frozen_linears_in(model: torch.nn.Module, dtype: torch.dtype):
    """Within the region, every nn.Linear weight and bias of `model` that is frozen (requires_grad False) and fp32
    is swapped for a copy in `dtype`, made once and kept until the parameter changes (another tensor, or written
    in place); the originals are back at exit.

    Why: autocast casts a weight to bf16 at every call unless it is a trainable leaf (its cache keeps only those,
    and only until the outermost region exits), so frozen weights (LoRA's base model, the reference model, a
    generation server's whole model) were cast again at every decode step: on the CPU, reading and writing the
    weights once more per token. Under autocast the copy is what the cast would have made (the same rounding), so
    outputs and gradients are bit for bit the same (tests/models/test_frozen_casts.py)."""
    swapped = []
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        for name, p in module._parameters.items():
            if p is None or p.requires_grad or p.dtype != torch.float32:
                continue
            copies = _FROZEN_COPIES.setdefault(module, {})  # only modules with a frozen weight get an entry
            kept = copies.get(name)
            if kept is None or kept[0] is not p or kept[1] != p._version:
                kept = copies[name] = (p, p._version, torch.nn.Parameter(p.detach().to(dtype), requires_grad=False))
            module._parameters[name] = kept[2]
            swapped.append((module, name, p))
    try:
        yield
    finally:
        for module, name, p in swapped:
            module._parameters[name] = p


def frozen_original(module: torch.nn.Module, name: str) -> torch.Tensor:
    """The parameter `name` of `module` as the model holds it: inside frozen_linears_in, the fp32 original its copy
    stands in for."""
    p = module._parameters[name]
    kept = _FROZEN_COPIES.get(module, {}).get(name)
    assert p is not None, f"{type(module).__name__} has no {name}"
    return kept[0] if kept is not None and kept[2] is p else p


@functools.cache  # read once: generation asks at every region
def cpu_has_fast_bf16() -> bool:
    """avx512_bf16 or AMX: bf16 matmuls run at about twice the fp32 rate (else they are emulated, slower)."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags
