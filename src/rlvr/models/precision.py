"""Mixed precision: bf16 autocast, and whether this CPU runs bf16 matmuls fast (natively)."""

from __future__ import annotations

import contextlib

import torch


def autocast_context(kind: str, device: torch.device):
    """`bf16`: bf16 autocast (matmuls in bf16, weights and optimizer state stay fp32); `none`: nothing.
    `model.autocast=auto` is resolved before any forward (rlvr.models.precision_choice), never here."""
    if kind == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if kind == "none":
        return contextlib.nullcontext()
    raise ValueError(f"autocast_context takes a resolved precision, 'bf16' or 'none', got {kind!r}")


def cpu_has_fast_bf16() -> bool:
    """avx512_bf16 or AMX: bf16 matmuls run at about twice the fp32 rate (else they are emulated, slower)."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags
