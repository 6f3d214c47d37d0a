"""Decode-shaped products from weights pre-packed for oneDNN (CPU generation).

A Linear's product on the CPU goes through a kernel that takes the weight in its plain layout at every call. At
decode shapes (one token per row, tens of rows) the products ran much faster from a weight packed once into
oneDNN's blocked layout (products alone, 2 threads, AMD EPYC; bench/results/packed_linear.md):
  * under bf16 autocast, 1.2-1.9x for weights of 128 x 128 and up (about 1.0x for a LoRA adapter's r=16 product),
    with the same bits out: oneDNN runs autocast's product too, and the packed weight only changes how it is read;
  * in fp32, 1.2-3.8x for weights of at least 256 x 256 (F.linear's kernel reaches a fraction of the machine's
    rate at 16-64 rows), and slower below (0.41-0.89x at 64 x 64 and 768 x 16), so smaller weights are never packed;
    the sums run in another order, so outputs differ from F.linear's by float rounding (~1e-5 relative at most).
    On an Intel Xeon the same products ran 0.85-0.92x packed at 512 wide and up but 1.01-1.17x at 320-384 wide
    (a 9M model's generation 10 % slower packed), so whether an fp32 weight shape packs is measured on the machine:
    once per (in, out, rows rounded up to a power of two, threads), kept in packing.json beside the precision
    cache (~/.cache/rlvr/, RLVR_PRECISION_CACHE's folder), so every later run there makes the same choice and
    draws the same samples for the same seeds. Delete the file to measure again.
Prefill- and training-sized products gain nothing (0.99x at 4608 rows). So inside a generation region every
plain nn.Linear of the model runs its calls of at most DECODE_ROWS_MAX rows from a packed copy of its weight,
packed at the first such call. The copies are dropped when the last region holding the model exits (a
trainer's next step changes the weights; packing again costs one pass over them), or with `keep` kept while the
weight is the same tensor at the same version (a generation server). Larger calls, calls with gradients, other
dtypes and bf16 weights outside autocast run as before. tests/models/test_packed_linears.py checks the bf16 path
bit for bit and the fp32 path to float rounding.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from rlvr.models.machine_cache import fastest_times, measured_once, power_of_two_at_least

DECODE_ROWS_MAX = 256  # rows per call up to which the packed weight is used (decode steps; not prefills)
FP32_MIN_WEIGHT = 256 * 256  # fp32 weights with fewer elements stay on F.linear (packed was slower there)
FP32_PACKED_AT_MOST = 0.97  # an fp32 shape packs when its packed product takes at most this share of F.linear's time

# module -> (the weight it was packed from, that weight's _version, packed weight, bias in its dtype or None)
_PACKED: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()
# first module of a fused group -> (the group's weights and biases, their _versions, packed weight, bias): as _PACKED,
# for fused_decode_weight
_FUSED: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()
_HOLDERS: "weakref.WeakKeyDictionary[torch.nn.Module, int]" = weakref.WeakKeyDictionary()  # module -> regions swapping it
_SWAP_LOCK = threading.Lock()
_FP32_CHOICES: dict[tuple[int, int, int, int], bool] = {}  # (in, out, rows bucket, threads) -> packs: packing.json, read once
_EXACT: dict[tuple, bool] = {}  # (in, outs, biases, rows bucket, threads) -> fused products give the separate ones' bits


def packing_applies(device: torch.device) -> bool:
    """Whether a region's Linear calls can run from packed weights: on the CPU, with oneDNN."""
    return device.type == "cpu" and torch.backends.mkldnn.is_available()


def bf16_packs() -> bool:
    """Whether bf16 products are packed too: with oneDNN's bf16 kernels, on a CPU that runs bf16 natively (where it
    was measured; elsewhere bf16 is emulated)."""
    from rlvr.models.precision import cpu_has_fast_bf16

    return torch.ops.mkldnn._is_mkldnn_bf16_supported() and cpu_has_fast_bf16()


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


def _packed(module: torch.nn.Linear, rows: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    w = module.weight
    kept = _PACKED.get(module)
    if kept is None or kept[0] is not w or kept[1] != w._version or kept[2].dtype != dtype:
        bias = None if module.bias is None else module.bias.detach().to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().to(dtype), rows)
        kept = _PACKED[module] = (w, w._version, packed, bias)
    return kept[2], kept[3]


def _packed_dtype(module: torch.nn.Linear, rows: int, x_dtype: torch.dtype, bf16_ok: bool) -> torch.dtype | None:
    """The dtype a call of `rows` rows of `x_dtype` runs its product in from a packed weight, or None: the call runs as before."""
    if rows > DECODE_ROWS_MAX or torch.is_grad_enabled():
        return None
    if torch.is_autocast_enabled("cpu"):  # autocast's product: inputs, weight and bias in bf16
        bf16 = bf16_ok and torch.get_autocast_dtype("cpu") == torch.bfloat16 and x_dtype in (torch.float32, torch.bfloat16)
        return torch.bfloat16 if bf16 else None
    fp32 = x_dtype == module.weight.dtype == torch.float32 and module.weight.numel() >= FP32_MIN_WEIGHT
    return torch.float32 if fp32 and fp32_packs(module.in_features, module.out_features, rows) else None


def fp32_packs(in_features: int, out_features: int, rows: int) -> bool:
    """Whether fp32 products of this weight shape at `rows` rows run from a packed weight: measured on this machine
    the first time (packed against F.linear), then read from packing.json (module docstring)."""
    shape = (in_features, out_features, power_of_two_at_least(rows), torch.get_num_threads())
    choice = _FP32_CHOICES.get(shape)
    if choice is None:
        choice = _FP32_CHOICES[shape] = _measured_choice(*shape[:3])
    return choice


def _measured_choice(in_features: int, out_features: int, rows: int) -> bool:
    def measure() -> dict:
        packed_s, plain_s = _time_fp32(in_features, out_features, rows)
        return {"packs": packed_s <= FP32_PACKED_AT_MOST * plain_s, "packed_s": packed_s, "plain_s": plain_s}

    entry = measured_once("packing", {"in": in_features, "out": out_features, "rows": rows}, measure)
    return bool(entry.get("packs"))


def _time_fp32(in_features: int, out_features: int, rows: int) -> tuple[float, float]:
    """Seconds per product (packed, F.linear) of random fp32 data of this shape (machine_cache.fastest_times)."""
    with torch.no_grad():
        x, w = torch.randn(rows, in_features), torch.randn(out_features, in_features)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
        packed_s, plain_s = fastest_times(
            [lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), lambda: F.linear(x, w)]
        )
    return packed_s, plain_s


def _forward(module: torch.nn.Linear, bf16_ok: bool, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // module.in_features
    dtype = _packed_dtype(module, rows, x.dtype, bf16_ok)
    if dtype is None:
        weight: torch.Tensor = module.weight
        bias: torch.Tensor | None = module.bias
        if not torch.is_grad_enabled() and not torch.is_autocast_enabled(x.device.type):
            # aten's matmul picks its kernel for a 3-d input (a prefill's [B, P, hidden]) by whether the weight requires
            # grad, and on an Intel Xeon the two kernels round differently: detached, a trained model generates the bits
            # a frozen one does (a generation server's). Not under autocast: its cast of a trainable weight is cached.
            weight, bias = weight.detach(), None if bias is None else bias.detach()
        return F.linear(x, weight, bias)
    packed, bias = _packed(module, rows, dtype)
    return torch.ops.mkldnn._linear_pointwise(x.to(dtype), packed, bias, "none", [], "")


def decode_weight(
    module: torch.nn.Linear, rows: int, autocast: torch.dtype | None, bf16_ok: bool
) -> tuple[torch.Tensor, torch.Tensor | None, bool] | None:
    """(weight, bias, packed) that a no-gradient call of `rows` rows inside a packing region computes with, for a caller
    that runs the product itself (rlvr.rollout.engines.hf.compiled_decode): the packed weight and bias in the product's
    dtype, or the plain fp32 weight (F.linear; small fp32 weights stay unpacked); None where the call would cast
    under autocast without packing (no fast bf16) or the module is not swapped (not a plain Linear)."""
    if module not in _HOLDERS:
        return None
    dtype = _packed_dtype(module, rows, torch.float32, bf16_ok)  # inputs: the fp32 residual stream's norms; bf16_ok read once by the caller
    if dtype is not None:
        packed, bias = _packed(module, rows, dtype)
        return packed, bias, True
    plain_fp32 = autocast is None and module.weight.dtype == torch.float32 and rows <= DECODE_ROWS_MAX
    return (module.weight.detach(), None if module.bias is None else module.bias.detach(), False) if plain_fp32 else None


def fused_decode_weight(modules: Sequence[torch.nn.Linear], rows: int, bf16_ok: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """One packed bf16 weight (and bias) for projections that read the same input (q, k and v; gate and up), their
    outputs side by side: one product instead of several, for a caller that runs it itself (the lean decode step).
    Only where each of them alone would run from a packed bf16 weight in this region (decode_weight: bf16 autocast,
    fast bf16) and the one product gives each output the bits the separate products give it at these shapes on this
    machine (_fuses_exactly); else None. Packed once while the weights stay the same, whatever the rows, as each
    module's own packed weight is (one copy for every rows bucket of a decode), and dropped with those."""
    in_features = {m.in_features for m in modules}
    if len(in_features) != 1 or any(m not in _HOLDERS or _packed_dtype(m, rows, torch.float32, bf16_ok) != torch.bfloat16 for m in modules):
        return None
    shape = (in_features.pop(), tuple(m.out_features for m in modules), tuple(m.bias is not None for m in modules))
    if not _fuses_exactly(*shape, rows):
        return None
    tensors = [t for m in modules for t in (m.weight, m.bias) if t is not None]
    versions = [t._version for t in tensors]  # bumped by every in-place write: an optimizer step, a load
    kept = _FUSED.get(modules[0])
    if kept is None or len(kept[0]) != len(tensors) or any(a is not b for a, b in zip(kept[0], tensors)) or kept[1] != versions:
        weight = torch.cat([m.weight.detach().to(torch.bfloat16) for m in modules])
        biases = [m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features) for m in modules]
        bias = torch.cat(biases).to(torch.bfloat16) if any(shape[2]) else None
        kept = _FUSED[modules[0]] = (tensors, versions, torch.ops.mkldnn._reorder_linear_weight(weight, rows), bias)
    return kept[2], kept[3]


def _fuses_exactly(in_features: int, outs: tuple[int, ...], biases: tuple[bool, ...], rows: int) -> bool:
    """Whether one packed bf16 product of weights [sum(outs), in] gives each output the same bits as the separate
    products of [out, in]: oneDNN sums each output over the input in the same order whatever the weight's other rows
    (every shape and row count tried on an AMD EPYC, 1 and 2 threads), but its blocking is its own choice per machine,
    so this is checked once per process, shape, rows bucket and thread count, on random data at a few row counts of the
    bucket (the order of a sum does not depend on the values)."""
    bucket = power_of_two_at_least(rows)
    key = (in_features, outs, biases, bucket, torch.get_num_threads())
    if key not in _EXACT:
        gen = torch.Generator().manual_seed(0)
        weights = [torch.randn(o, in_features, generator=gen).bfloat16() for o in outs]
        bias = [torch.randn(o, generator=gen).bfloat16() if b else None for o, b in zip(outs, biases)]
        parts = [(torch.ops.mkldnn._reorder_linear_weight(w, bucket), b) for w, b in zip(weights, bias)]
        zeros = [b if b is not None else torch.zeros(o, dtype=torch.bfloat16) for o, b in zip(outs, bias)]
        fused = torch.ops.mkldnn._reorder_linear_weight(torch.cat(weights), bucket), torch.cat(zeros) if any(biases) else None
        _EXACT[key] = True
        for n in sorted({1, bucket // 2 + 1, bucket}):
            x = torch.randn(n, in_features, generator=gen).bfloat16()
            apart = torch.cat([torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "") for w, b in parts], -1)
            _EXACT[key] &= torch.equal(apart, torch.ops.mkldnn._linear_pointwise(x, *fused, "none", [], ""))
    return _EXACT[key]


@contextlib.contextmanager
def packed_linears_in(model: torch.nn.Module, keep: bool = False) -> Iterator[None]:
    """Within the region, the model's plain nn.Linear layers run decode-shaped calls from packed weights (see the
    module docstring), where packing_applies; their own forward is back when the last region holding them exits
    (regions may overlap: the agent endpoint's decoder thread holds one for its lifetime while the engine
    generates on the same model), and the packed copies are dropped then unless `keep` (weights that do not
    change between regions: a generation server)."""
    param = next(model.parameters(), None)
    if param is None or not packing_applies(param.device):
        yield
        return
    held: list[torch.nn.Module] = []
    with _SWAP_LOCK:
        bf16_ok = bf16_packs()
        for m in model.modules():
            if m in _HOLDERS:  # swapped by an overlapping region
                _HOLDERS[m] += 1
            elif isinstance(m, torch.nn.Linear) and _plain(m):
                m.forward = functools.partial(_forward, m, bf16_ok)  # type: ignore[method-assign]  # __call__ calls it
                _HOLDERS[m] = 1
            else:
                continue
            held.append(m)
    try:
        yield
    finally:
        with _SWAP_LOCK:
            for m in held:
                _HOLDERS[m] -= 1
                if _HOLDERS[m] == 0:
                    del _HOLDERS[m]
                    del m.forward
                    if not keep:
                        _PACKED.pop(m, None)
                        _FUSED.pop(m, None)
