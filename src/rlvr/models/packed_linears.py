"""Decode-shaped bf16 products from weights pre-packed for oneDNN (CPU generation under bf16 autocast).

Under CPU bf16 autocast an nn.Linear's product runs in oneDNN, which reorders the weight into its blocked layout
at every call. At decode shapes (one token per row, tens of rows) that reorder is a large share of the product:
the decode products of 9M-76M Llamas ran 1.26-1.31x faster from weights packed once for the decode's row count
(1.17-1.29x packed without it), with the same bits out; prefill- and training-sized products gain nothing
(0.99x at 4608 rows). So inside a generation region every plain nn.Linear of the model runs its decode-shaped
calls (at most DECODE_ROWS_MAX rows) from a packed bf16 copy of its weight, packed at the first such call and
kept while the weight is the same tensor at the same version (an optimizer step or a load bumps the version;
the next region packs again). Larger calls, calls with gradients and calls outside bf16 autocast run as before.
The packed call computes what autocast's would (inputs, weight and bias in bf16, the same kernel family):
tests/models/test_packed_linears.py checks it bit for bit.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F

DECODE_ROWS_MAX = 256  # rows per call up to which the packed weight is used (decode steps; not prefills)

# module -> (the weight it was packed from, that weight's _version, packed weight, bf16 bias or None)
_PACKED: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()


def packing_applies(device: torch.device) -> bool:
    """Whether this region's Linear calls can run from packed weights: the CPU under bf16 autocast, with oneDNN's
    bf16 kernels and a CPU that runs bf16 natively (where it was measured; elsewhere bf16 is emulated)."""
    from rlvr.models.precision import cpu_has_fast_bf16

    return (
        device.type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        and cpu_has_fast_bf16()
    )


def _plain(module: torch.nn.Module) -> bool:
    w = module.weight
    return (
        type(module) is torch.nn.Linear
        and type(w) in (torch.Tensor, torch.nn.Parameter)  # not a DTensor shard or a quantised weight
        and w.layout == torch.strided
        and w.device.type == "cpu"
        and w.dtype in (torch.float32, torch.bfloat16)
        and "forward" not in module.__dict__  # nobody else's forward override (accelerate's hooks)
    )


def _packed(module: torch.nn.Linear, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    w = module.weight
    kept = _PACKED.get(module)
    if kept is None or kept[0] is not w or kept[1] != w._version:
        bias = None if module.bias is None else module.bias.detach().to(torch.bfloat16)
        packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().to(torch.bfloat16), rows)
        kept = _PACKED[module] = (w, w._version, packed, bias)
    return kept[2], kept[3]


def _forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // module.in_features
    if (
        rows > DECODE_ROWS_MAX
        or torch.is_grad_enabled()
        or x.dtype not in (torch.float32, torch.bfloat16)
        or not torch.is_autocast_enabled("cpu")
        or torch.get_autocast_dtype("cpu") != torch.bfloat16
    ):
        return F.linear(x, module.weight, module.bias)
    packed, bias = _packed(module, rows)
    return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), packed, bias, "none", [], "")


@contextlib.contextmanager
def packed_linears_in(model: torch.nn.Module) -> Iterator[None]:
    """Within the region, the model's plain nn.Linear layers run decode-shaped calls from packed weights (see the
    module docstring), where packing_applies; their own forward is back at exit."""
    param = next(model.parameters(), None)
    if param is None or not packing_applies(param.device):
        yield
        return
    swapped = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and _plain(m)]
    for m in swapped:
        m.forward = _forward.__get__(m)  # type: ignore[method-assign]  # an instance attribute: __call__ (and its hooks) call it
    try:
        yield
    finally:
        for m in swapped:
            del m.forward
