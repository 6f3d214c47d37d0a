"""The lean decode step's layers under torch.compile (`rollout.compile`), on the CPU.

Between its products a decode step of a small model runs dozens of small kernels per layer: norms, the rotary
embedding, the KV write, the attention's softmax, the residual adds, SiLU, casts. Each reads and writes its
[rows x hidden] tensor and pays a dispatch; together they were about half of a bf16 decode step on config B's
model (bench/results/floor_profile.md). Compiled, inductor fuses them into a few C++ loops around the products,
and the attention over one query per row into one loop over each row's keys and values.

The layer is `decoder_layer`, written out from the modules' own math (lean_decode.py's eligibility: Llama-family
pre-norm layers); its products go through `decode_linear`, an op inductor cannot see into, which runs the same
oneDNN product from the same packed weight as the eager step (rlvr.models.packed_linears). So the compiled and
eager steps differ only in how the elementwise work rounds. Weights are the layer's inputs, not constants: one
graph serves every layer, and an optimizer step needs no recompile. Rows and slots are dynamic: one graph per
KV layout for the whole run (the shared layout two: its first token's single slot is specialised apart). What
compiling cost is counted (`clock`); bench/results/floor_decode_compile.md measures what it gains (off by default).
tests/rollout/test_compiled_decode.py checks tokens and log-probs against the eager step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F

from rlvr.models.compiled import CompileClock, require_cpp_compiler
from rlvr.models.norm_rotary import rotate
from rlvr.models.lora_merge import plain_lora
from rlvr.models.packed_linears import decode_weight, packed_product
from rlvr.rollout.engines.hf.decode_attention import decode_attention

RECOMPILE_LIMIT = 16  # graphs (layouts x dtypes) before torch.compile falls back to eager


@torch.library.custom_op("rlvr::decode_linear", mutates_args=())
def decode_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_features: int, way: str) -> torch.Tensor:
    """packed_product as an op opaque to inductor: the eager step's product inside the compiled layer."""
    return packed_product(x, weight, bias, way, out_features)


@decode_linear.register_fake
def _(x, weight, bias, out_features, way):
    return x.new_empty(*x.shape[:-1], out_features)


@torch.library.custom_op("rlvr::decode_materialize", mutates_args=())
def materialize(x: torch.Tensor) -> torch.Tensor:
    """x, computed where it stands: an op inductor cannot see into, so the pointwise work that made x runs once. The
    rotated queries need it: inlined into the attention's loop over keys, inductor recomputed the rotation (a gather
    per lane for the half roll) for every key, which made config B's compiled generation 3.7x the eager step's on an
    Intel Xeon (bench/results/decode_compile_intel.md)."""
    return x.clone()


@materialize.register_fake
def _(x):
    return torch.empty_like(x)


class Product(NamedTuple):
    weight: torch.Tensor  # packed for `way` (rlvr.models.packed_linears), or plain [out, in]
    bias: torch.Tensor | None
    out_features: int
    way: str  # packed_linears.PLAIN, ONEDNN or NATIVE


class LoraProduct(NamedTuple):
    """A peft LoRA Linear's forward from the weights its three Linears compute with in a packing region: peft's
    vanilla LoRA, base(x) + B(A(x)) x scaling, in peft's order (lora_product_for)."""

    base: Product
    a: Product  # lora_A [r, in]
    b: Product  # lora_B [out, r]
    scaling: float


class LayerWeights(NamedTuple):
    input_norm: torch.Tensor  # [hidden] fp32
    q: Product
    k: Product
    v: Product
    o: Product
    post_norm: torch.Tensor  # [hidden]
    gate: Product
    up: Product
    down: Product
    q_norm: torch.Tensor | None  # qwen3: per-head norms of q and k, [D]
    k_norm: torch.Tensor | None


def _linear(x: torch.Tensor, p: Product, dtype: torch.dtype) -> torch.Tensor:
    return decode_linear(x.to(dtype), p.weight, p.bias, p.out_features, p.way)


def _head_norm(x, weight, eps: float):  # Qwen3RMSNorm on a [n, H, D] tensor: fp32 inside, the input's dtype out
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def decoder_layer(
    x: torch.Tensor,  # [n, hidden] fp32, the residual stream
    cos: torch.Tensor,  # [n, 1, D]
    sin_signed: torch.Tensor,  # [n, 1, D]: norm_rotary.signed_sin of the rotary's sin
    w: LayerWeights,
    eps: float,
    heads: tuple[int, int, int],  # (Hq, Hkv, D)
    dtype: torch.dtype,  # the products' dtype: bf16 under CPU autocast, else fp32
    attention: tuple,  # decode_attention's arguments after q, k, v
) -> torch.Tensor:
    """One pre-norm Llama-family layer for one new token per row: x + attn(norm(x)), then + mlp(norm(.))."""
    (Hq, Hkv, D), n = heads, x.shape[0]
    h = F.rms_norm(x, w.input_norm.shape, w.input_norm, eps)
    q = _linear(h, w.q, dtype).view(n, Hq, D)
    k = _linear(h, w.k, dtype).view(n, Hkv, D)
    v = _linear(h, w.v, dtype).view(n, Hkv, D)
    if w.q_norm is not None and w.k_norm is not None:
        q, k = _head_norm(q, w.q_norm, eps), _head_norm(k, w.k_norm, eps)
    q, k = materialize(rotate(q, cos, sin_signed)), rotate(k, cos, sin_signed)  # k: written to the cache once anyway
    a = decode_attention(q, k, v, *attention)  # [n, Hq x D] in the cache's dtype
    x = x + _linear(a, w.o, dtype)
    h = F.rms_norm(x, w.post_norm.shape, w.post_norm, eps)
    gate, up = _linear(h, w.gate, dtype), _linear(h, w.up, dtype)
    return x + _linear(F.silu(gate) * up, w.down, dtype)


def linear_base(module):
    """The plain Linear a projection computes with now: itself, or a peft LoRA layer's base while its adapter runs
    merged into it (rlvr.models.lora_merge); None for anything else."""
    if type(module) is torch.nn.Linear:
        return module
    base = getattr(module, "base_layer", None)
    return base if type(base) is torch.nn.Linear and getattr(module, "merged_adapters", None) else None


def product_for(module, rows: int, autocast: torch.dtype | None, bf16_ok: bool) -> Product | None:
    """The weight a call of `rows` rows of this projection computes with inside a packing region, as a Product; None
    when it is not a plain Linear (or a merged LoRA layer's) or the call would not run from such a weight
    (rlvr.models.packed_linears.decode_weight)."""
    base = linear_base(module)
    got = None if base is None else decode_weight(base, rows, autocast, bf16_ok)
    return None if got is None or base is None else Product(got[0], got[1], base.out_features, got[2])


def lora_product_for(module, rows: int, autocast: torch.dtype | None, bf16_ok: bool) -> LoraProduct | None:
    """A peft LoRA Linear with one plain adapter (rlvr.models.lora_merge's test: no dropout in training mode, no
    variant, bias or second adapter) as its three products, where each of its Linears runs from a Product; else None."""
    plan = plain_lora(module)
    if plan is None:
        return None
    adapter = next(a for a in module.active_adapters if a in module.lora_A)
    parts = [product_for(m, rows, autocast, bf16_ok) for m in (plan[0], module.lora_A[adapter], module.lora_B[adapter])]
    if any(p is None for p in parts):
        return None
    base, a, b = cast(list[Product], parts)
    return LoraProduct(base, a, b, plan[3])


def layer_weights(layer, rows: int, autocast: torch.dtype | None, bf16_ok: bool) -> LayerWeights | None:
    """The layer's weights as decoder_layer takes them, for a call of `rows` rows; None when a projection's product
    would not run as the eager step runs it (product_for)."""
    attn, mlp = layer.self_attn, layer.mlp
    modules = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    products = [product_for(module, rows, autocast, bf16_ok) for module in modules]
    if any(p is None for p in products):
        return None
    q, k, v, o, gate, up, down = cast(list[Product], products)
    norms = [getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)]
    q_norm, k_norm = (None, None) if norms[0] is None else (norms[0].weight, norms[1].weight)  # type: ignore[union-attr]
    return LayerWeights(layer.input_layernorm.weight, q, k, v, o, layer.post_attention_layernorm.weight, gate, up, down, q_norm, k_norm)


class CompiledLayers:
    """decoder_layer under torch.compile, with dynamic shapes; call it inside `running()`, once per step (not per
    layer: the settings and the clock cost tens of microseconds to enter); `clock` counts graphs and build seconds."""

    def __init__(self):
        require_cpp_compiler("rollout.compile")
        self.fn = torch.compile(decoder_layer, dynamic=True)
        self.clock = CompileClock()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        # duck sizing would make sizes equal at the first call (64 rows, head dim 64) one symbol: a recompile when they part
        with (
            torch.fx.experimental._config.patch(use_duck_shape=False),  # type: ignore[attr-defined]
            torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT),
            self.clock.measuring(),
        ):
            yield

    def __call__(self, *args) -> torch.Tensor:
        return self.fn(*args)
