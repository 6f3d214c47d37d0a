"""Decode-shaped products from weights pre-packed once per generation (CPU generation): oneDNN's blocked layout, or
the panels of rlvr.models.native_linear's fp32 kernel.

A Linear's product on the CPU goes through a kernel that takes the weight in its plain layout at every call. At
decode shapes (one token per row, tens of rows) the products ran much faster from a weight packed once into
oneDNN's blocked layout (products alone, 2 threads, AMD EPYC; bench/results/packed_linear.md):
  * under bf16 autocast, 1.2-1.9x for weights of 128 x 128 and up (about 1.0x for a LoRA adapter's r=16 product),
    with the same bits out: oneDNN runs autocast's product too, and the packed weight only changes how it is read;
  * in fp32, 1.2-3.8x for weights of at least 256 x 256 (F.linear's kernel reaches a fraction of the machine's
    rate at 16-64 rows), and slower below (0.41-0.89x at 64 x 64 and 768 x 16), so smaller weights never take it;
    the sums run in another order, so outputs differ from F.linear's by float rounding (~1e-5 relative at most).
    On an Intel Xeon the same products ran 0.85-0.92x packed at 512 wide and up but 1.01-1.17x at 320-384 wide
    (a 9M model's generation 10 % slower packed).
The native fp32 kernel (native_linear.py) ran them faster again on an AMD EPYC without AVX-512 (weights read from
memory, 2 threads; bench/results/native_linear_amd.md): 0.61-0.91x the time of the faster of F.linear and oneDNN at 64
rows for weights of 64 x 64 to 2048 x 768, 0.53-0.80x at 16 rows, 0.67-0.98x at 256 (slower only for the narrowest:
16 inputs or outputs, 64 x 64 at 256 rows); and each output's bits do not depend on the call (rows, threads, the
weights packed beside it). So how an fp32 weight shape runs (PLAIN: F.linear, ONEDNN, NATIVE) is measured on the
machine: once per (in, out, rows rounded up to a power of two, threads, the ways compared), kept in packing.json beside
the precision cache (~/.cache/rlvr/, RLVR_PRECISION_CACHE's folder), so every later run there makes the same choice and
draws the same samples for the same seeds. Delete the file to measure again. Weights under FP32_MIN_WEIGHT never
take oneDNN's (slower there); the native kernel competes at every size.
Projections that read one input, q/k/v and gate/up of a layer up to GROUP_MAX_IN wide, decide their way together:
measured as they then run (F.linear's or oneDNN's products one by one, or one native product of the weights side by
side, which gives each projection its own bits: the lean decode step runs it so, layer_products). At a small model's
decode shapes the one product is what pays: the tiny model's (128 wide) q, k and v ran natively at 1.0x F.linear's
time one by one, but at 0.73x as one product (64 rows, 2 threads, AMD EPYC).
Prefill- and training-sized products gain nothing (0.99x at 4608 rows). So inside a generation region every
plain nn.Linear of the model runs its calls of at most DECODE_ROWS_MAX rows from a packed copy of its weight,
packed at the first such call. The copies are dropped when the last region holding the model exits (a
trainer's next step changes the weights; packing again costs one pass over them), or with `keep` kept while the
weight is the same tensor at the same version (a generation server). Larger calls, calls with gradients, other
dtypes and bf16 weights outside autocast run as before. tests/models/test_packed_linears.py checks the bf16 path
bit for bit and the fp32 paths to float rounding.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence

import torch
import torch.nn.functional as F

from rlvr.models import native_linear
from rlvr.models.machine_cache import fastest_times, measured_once, power_of_two_at_least

DECODE_ROWS_MAX = 256  # rows per call up to which the packed weight is used (decode steps; not prefills)
FP32_MIN_WEIGHT = 256 * 256  # fp32 weights with fewer elements never take oneDNN's packed product (slower there)
GROUP_MAX_IN = 512  # q/k/v and gate/up up to this many inputs decide their fp32 way together (module docstring)
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # a layer's projections of one input, by name
FP32_PACKED_AT_MOST = 0.97  # an fp32 shape packs when its packed product takes at most this share of F.linear's time
# how a product runs: F.linear on the module's weight (PLAIN), oneDNN from its blocked layout (ONEDNN), or
# rlvr.models.native_linear from its panels (NATIVE, fp32 only)
PLAIN, ONEDNN, NATIVE = "plain", "onednn", "native"

# module -> (the weight it was packed from, that weight's _version, packed weight, bias in its dtype or None)
_PACKED: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()
# first module of a fused group -> (the group's weights and biases, their _versions, packed weight, bias): as _PACKED,
# for fused_decode_weight
_FUSED: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()
_HOLDERS: "weakref.WeakKeyDictionary[torch.nn.Module, int]" = weakref.WeakKeyDictionary()  # module -> regions swapping it
# module -> its group (GROUPS: q/k/v or gate/up of its layer, all swapped), while swapped
_GROUP_OF: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[torch.nn.Linear, ...]]" = weakref.WeakKeyDictionary()
_SWAP_LOCK = threading.Lock()
_FP32_CHOICES: dict[tuple, str] = {}  # (in, out or a group's outs, rows bucket, threads) -> way: packing.json, read once
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


def _pack(weights: Sequence[torch.Tensor], rows: int, dtype: torch.dtype, way: str) -> torch.Tensor:
    """Weights [out_i, in] (outputs side by side) packed for `way` in `dtype`."""
    if way == NATIVE:
        return native_linear.pack(weights)
    weight = weights[0].detach() if len(weights) == 1 else torch.cat([w.detach() for w in weights])
    return torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype), rows)


def _packed(module: torch.nn.Linear, rows: int, dtype: torch.dtype, way: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    w = module.weight
    kept = _PACKED.get(module)
    if kept is None or kept[0] is not w or kept[1] != w._version or kept[2].dtype != dtype or kept[4] != way:
        bias = None if module.bias is None else module.bias.detach().to(dtype).contiguous()
        kept = _PACKED[module] = (w, w._version, _pack([w], rows, dtype, way), bias, way)
    return kept[2], kept[3]


def packed_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, way: str, out_features: int) -> torch.Tensor:
    """x W^T + b the `way` a packing region's Linear call runs it, from the weight `_pack` made for that way (PLAIN: the
    module's own), for callers that hold the weight themselves (the lean decode step)."""
    if way == ONEDNN:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    if way == NATIVE:
        return native_linear.linear(x, weight, bias, out_features)
    return F.linear(x, weight, bias)


def _packing(module: torch.nn.Linear, rows: int, x_dtype: torch.dtype, bf16_ok: bool) -> tuple[torch.dtype, str] | None:
    """(dtype, way) a call of `rows` rows of `x_dtype` runs its product in from a packed weight, or None: the call runs
    as before."""
    if rows > DECODE_ROWS_MAX or torch.is_grad_enabled():
        return None
    if torch.is_autocast_enabled("cpu"):  # autocast's product: inputs, weight and bias in bf16
        bf16 = bf16_ok and torch.get_autocast_dtype("cpu") == torch.bfloat16 and x_dtype in (torch.float32, torch.bfloat16)
        return (torch.bfloat16, ONEDNN) if bf16 else None
    if x_dtype != torch.float32 or module.weight.dtype != torch.float32:
        return None
    group = _GROUP_OF.get(module)
    way = fp32_way(module.in_features, module.out_features if group is None else tuple(m.out_features for m in group), rows)
    return None if way == PLAIN else (torch.float32, way)


def fp32_ways() -> tuple[str, ...]:
    """The packed ways an fp32 product can take here: oneDNN's, and the native kernel where it builds."""
    return (ONEDNN, NATIVE) if native_linear.available() else (ONEDNN,)


def fp32_way(in_features: int, out_features: int | tuple[int, ...], rows: int) -> str:
    """How fp32 products of this weight shape at `rows` rows run (PLAIN, ONEDNN or NATIVE), or of a group's weights
    (out_features: theirs, in order; module docstring): measured on this machine the first time, then read from
    packing.json (module docstring)."""
    shape = (in_features, out_features, power_of_two_at_least(rows), torch.get_num_threads())
    choice = _FP32_CHOICES.get(shape)
    if choice is None:
        choice = _FP32_CHOICES[shape] = _measured_way(*shape[:3])
    return choice


def _measured_way(in_features: int, out_features: int | tuple[int, ...], rows: int) -> str:
    """The fastest of the ways that can take the shape (fp32_ways(); oneDNN's from FP32_MIN_WEIGHT up) where it takes
    at most FP32_PACKED_AT_MOST of F.linear's time, else PLAIN."""
    outs = (out_features,) if isinstance(out_features, int) else out_features
    ways = tuple(w for w in fp32_ways() if w != ONEDNN or in_features * min(outs) >= FP32_MIN_WEIGHT)
    if not ways:
        return PLAIN

    def measure() -> dict:
        times = _time_fp32(in_features, out_features, rows, ways)
        best = min(ways, key=lambda w: times[w])
        return {"way": best if times[best] <= FP32_PACKED_AT_MOST * times[PLAIN] else PLAIN} | {f"{w}_s": t for w, t in times.items()}

    shape = {"in": in_features, "out": out_features, "rows": rows, "ways": ",".join(ways)}
    way = measured_once("packing", shape, measure).get("way")
    return way if way in ways else PLAIN


def _time_fp32(in_features: int, out_features: int | tuple[int, ...], rows: int, ways: Sequence[str]) -> dict[str, float]:
    """Seconds per product of random fp32 data of this shape, PLAIN and each of `ways` (machine_cache.fastest_times);
    a group's as it runs: F.linear's and oneDNN's products one by one, the native kernel's as one."""
    outs = (out_features,) if isinstance(out_features, int) else out_features
    with torch.no_grad():
        x, weights = torch.randn(rows, in_features), [torch.randn(o, in_features) for o in outs]

        def apart(way: str) -> Callable[[], object]:
            packed = [_pack([w], rows, torch.float32, way) for w in weights]
            return lambda: [packed_product(x, p, None, way, o) for p, o in zip(packed, outs)]

        def together() -> Callable[[], object]:
            return functools.partial(packed_product, x, _pack(weights, rows, torch.float32, NATIVE), None, NATIVE, sum(outs))

        calls = [lambda: [F.linear(x, w) for w in weights]] + [together() if way == NATIVE else apart(way) for way in ways]
        return dict(zip((PLAIN, *ways), fastest_times(calls)))


def _forward(module: torch.nn.Linear, bf16_ok: bool, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // module.in_features
    packing = _packing(module, rows, x.dtype, bf16_ok)
    if packing is None:
        weight: torch.Tensor = module.weight
        bias: torch.Tensor | None = module.bias
        if not torch.is_grad_enabled() and not torch.is_autocast_enabled(x.device.type):
            # aten's matmul picks its kernel for a 3-d input (a prefill's [B, P, hidden]) by whether the weight requires
            # grad, and on an Intel Xeon the two kernels round differently: detached, a trained model generates the bits
            # a frozen one does (a generation server's). Not under autocast: its cast of a trainable weight is cached.
            weight, bias = weight.detach(), None if bias is None else bias.detach()
        return F.linear(x, weight, bias)
    dtype, way = packing
    packed, bias = _packed(module, rows, dtype, way)
    return packed_product(x.to(dtype), packed, bias, way, module.out_features)


def decode_weight(
    module: torch.nn.Linear, rows: int, autocast: torch.dtype | None, bf16_ok: bool
) -> tuple[torch.Tensor, torch.Tensor | None, str] | None:
    """(weight, bias, way) that a no-gradient call of `rows` rows inside a packing region computes with, for a caller
    that runs the product itself (rlvr.rollout.engines.hf.compiled_decode): the packed weight and bias in the product's
    dtype, or the plain fp32 weight (F.linear, where that measured fastest); None where the call would cast
    under autocast without packing (no fast bf16) or the module is not swapped (not a plain Linear)."""
    if module not in _HOLDERS:
        return None
    packing = _packing(module, rows, torch.float32, bf16_ok)  # inputs: the fp32 residual stream's norms; bf16_ok read once by the caller
    if packing is not None:
        packed, bias = _packed(module, rows, *packing)
        return packed, bias, packing[1]
    plain_fp32 = autocast is None and module.weight.dtype == torch.float32 and rows <= DECODE_ROWS_MAX
    return (module.weight.detach(), None if module.bias is None else module.bias.detach(), PLAIN) if plain_fp32 else None


def fused_decode_weight(
    modules: Sequence[torch.nn.Linear], rows: int, bf16_ok: bool, ways: Collection[str] = (ONEDNN, NATIVE)
) -> tuple[torch.Tensor, torch.Tensor | None, str] | None:
    """One packed weight, bias and way for projections that read the same input (q, k and v; gate and up), their
    outputs side by side: one product instead of several, for a caller that runs it itself (the lean decode step).
    Only where each of them alone would run from a weight packed the same way in this region (decode_weight) and the
    one product gives each output the bits the separate products give it: always so for the native fp32 kernel (each
    output its own chain, rlvr.models.native_linear), for oneDNN's bf16 products where checked at these shapes on this
    machine (_fuses_exactly), never for oneDNN's fp32 ones (their sums ran in another order fused); and only where that
    way is one of `ways` (the caller's choice: layer_products.fuses); else None. Packed
    once while the weights stay the same, whatever the rows, as each module's own packed weight is (one copy for every
    rows bucket of a decode), and dropped with those."""
    in_features = {m.in_features for m in modules}
    packings = {_packing(m, rows, torch.float32, bf16_ok) if m in _HOLDERS else None for m in modules}
    if len(in_features) != 1 or len(packings) != 1 or None in packings:
        return None
    dtype, way = packings.pop()  # type: ignore[misc]  # not None: checked
    if way not in ways:
        return None
    shape = (in_features.pop(), tuple(m.out_features for m in modules), tuple(m.bias is not None for m in modules))
    if way == ONEDNN and (dtype != torch.bfloat16 or not _fuses_exactly(*shape, rows)):
        return None
    tensors = [t for m in modules for t in (m.weight, m.bias) if t is not None]
    versions = [t._version for t in tensors]  # bumped by every in-place write: an optimizer step, a load
    kept = _FUSED.get(modules[0])
    same = kept is not None and len(kept[0]) == len(tensors) and all(a is b for a, b in zip(kept[0], tensors))
    if kept is None or not same or kept[1] != versions or kept[4] != way:
        biases = [m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features) for m in modules]
        bias = torch.cat(biases).to(dtype) if any(shape[2]) else None
        kept = _FUSED[modules[0]] = (tensors, versions, _pack([m.weight for m in modules], rows, dtype, way), bias, way)
    return kept[2], kept[3], way


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


def _groups(model: torch.nn.Module) -> Iterator[tuple[torch.nn.Linear, ...]]:
    """Each layer's swapped projections of one input (GROUPS) up to GROUP_MAX_IN wide."""
    for m in model.modules():
        for names in GROUPS:
            group = tuple(p for name in names if isinstance(p := getattr(m, name, None), torch.nn.Linear) and p in _HOLDERS)
            if len(group) == len(names) and len({p.in_features for p in group}) == 1 and group[0].in_features <= GROUP_MAX_IN:
                yield group


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
        for group in _groups(model):
            _GROUP_OF.update((p, group) for p in group)
    try:
        yield
    finally:
        with _SWAP_LOCK:
            for m in held:
                _HOLDERS[m] -= 1
                if _HOLDERS[m] == 0:
                    del _HOLDERS[m]
                    del m.forward
                    _GROUP_OF.pop(m, None)
                    if not keep:
                        _PACKED.pop(m, None)
                        _FUSED.pop(m, None)
