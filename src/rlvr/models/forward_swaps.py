"""Module forwards swapped for one block.

The training forward's passes (norm_rotary's RMSNorm, native_swiglu's MLP, lora_training's adapters, shared_cast's
q/k/v products) each give some modules a forward of their own for the block around the training forward, and put
back what was there after: the class's forward (the instance attribute deleted), or an instance forward that a
surrounding block had set. (packed_linears counts its holders instead: its regions overlap across threads.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch


@contextlib.contextmanager
def swapped_forwards(swaps: Iterable[tuple[torch.nn.Module, Callable]]) -> Iterator[int]:
    """Inside the block each module's forward is the callable paired with it; yields how many modules were swapped."""
    before: list[tuple[torch.nn.Module, Callable | None]] = []
    for module, forward in swaps:
        before.append((module, module.__dict__.get("forward")))
        module.forward = forward
    try:
        yield len(before)
    finally:
        for module, previous in reversed(before):
            if previous is None:
                del module.forward
            else:
                module.forward = previous
