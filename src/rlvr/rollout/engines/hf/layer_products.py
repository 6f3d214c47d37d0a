"""The lean decode step's products, per layer: from the weights the modules' calls would use, q/k/v and gate/up fused.

Each projection runs as a Product (compiled_decode.py) where its module's call in the packing region would compute
exactly that from a weight it holds (rlvr.models.packed_linears), a LoraProduct for a peft LoRA layer, else as the module.
And on the CPU q, k and v run as one product, gate and up as one, where each part runs packed the same way: oneDNN's
bf16 products under autocast, or the native fp32 kernel.

At decode shapes (one token per row, tens of rows) a product of a small model's projection barely fills the machine:
it pays a dispatch, a read of the normed input and a thread fan-out for little work, worst for grouped-query
attention's narrow k and v ([rows x hidden] x [hidden x kv heads x D]). One product with the weights side by side does
the work of three (two) with the same sums per output. Products alone, 8 layers' worth of packed bf16 weights, 2 threads,
AMD EPYC: fused/separate 0.81 (9M, hidden 320, 2 kv heads of 40) to 0.96-0.99 (hidden 512-896) at 64 rows, 0.63-0.91
at 16 rows. Whole generations (bench/results/fused_products_amd.md; noise about 2 %) gained less: 0.94-0.95 (3M, 2 kv
heads of 64 for 4 q heads), 0.985-0.99 (9M and 76M grouped-query models), but 1.01-1.02 for 8 heads of 64 without
grouping (25M; 0.995 at 16 rows). So oneDNN's bf16 products fuse for grouped-query models up to
packed_linears.GROUP_MAX_IN wide only (fuses), where the narrow products cost most: above, the gain was within noise
alone and the fused copy would add to the packed memory (each module keeps its own packed weight for the prefill's
calls too). The native fp32 kernel's fuse for every model up to that width: there packed_linears decides q/k/v's
(gate/up's) way as the one product that runs here, measured against the separate products of the other ways.

Only where the separate products would each run from a weight packed the same way (rlvr.models.packed_linears) and
the one product gives each output exactly their bits: the step then draws the same tokens with the same log-probs as
the modules' calls (the continuous decoder's, transformers' forward). oneDNN's bf16 products (bf16 autocast on a CPU
with fast bf16) are checked per shape on the machine (packed_linears.fused_decode_weight); the native fp32 kernel's
always give them (each output its own chain, rlvr.models.native_linear). oneDNN's and F.linear's fp32 products are
never fused: on an AMD EPYC their sums ran in another order fused (differences of ~1e-7: other samples for the same
seeds); on an Intel Xeon they gave the same bits almost everywhere, but fused fp32 generations were no faster
(1.01-1.03x, bench/results/fused_products_fp32_intel.md).
A LoRA-wrapped projection (an unmerged adapter) stays apart, its group unfused.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rlvr.models.native_swiglu import PLAIN_MLPS
from rlvr.models.packed_linears import GROUP_MAX_IN, NATIVE, ONEDNN, bf16_packs, fused_decode_weight
from rlvr.rollout.engines.hf.compiled_decode import LoraProduct, Product, linear_base, lora_product_for, product_for

FUSE = True  # False: every projection apart (bench/fused_products_ab.py's "apart")


def fuses(config) -> frozenset[str]:
    """The ways whose q/k/v and gate/up products a model with this transformers config decodes as one product each
    (module docstring): the native kernel's up to GROUP_MAX_IN wide, and oneDNN's bf16 ones there for grouped-query
    models."""
    q_heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if not FUSE or config.hidden_size > GROUP_MAX_IN:
        return frozenset()
    return frozenset({NATIVE, ONEDNN} if kv_heads < q_heads else {NATIVE})


Projection = Product | LoraProduct | torch.nn.Module


class LayerProducts(NamedTuple):
    """One layer's products for a rows bucket."""

    qkv: tuple[Projection, ...]  # (q, k, v), or one Product computing the three side by side
    o: Projection
    gate_up: tuple[Projection, ...]  # (gate, up), or one Product computing both side by side, or () for an MLP that
    # is not the Llama-family SwiGLU (called whole)
    down: Projection | None  # None with gate_up ()


def products_for(layers, lm_head, rows: int, device: torch.device, autocast: torch.dtype | None, fuse: frozenset[str]) -> list:
    """LayerProducts per layer, and last the lm_head's Projection, for calls of `rows` rows under `autocast`; `fuse`:
    the ways whose q/k/v and gate/up run as one product each where that gives the same bits (fuses(config))."""
    bf16_ok = bf16_packs()

    def direct(m) -> Projection:
        if device.type != "cpu":
            return m
        return product_for(m, rows, autocast, bf16_ok) or lora_product_for(m, rows, autocast, bf16_ok) or m

    def fused(*modules) -> Product | None:  # decided before the separate products, which would pack their own weights
        return fused_product(modules, rows, bf16_ok, fuse) if fuse and device.type == "cpu" else None

    products: list = []
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = fused(attn.q_proj, attn.k_proj, attn.v_proj)
        mlp_parts: tuple[Projection, ...] = ()
        if type(mlp).__name__ in PLAIN_MLPS:
            gate_up = fused(mlp.gate_proj, mlp.up_proj)
            mlp_parts = (gate_up,) if gate_up is not None else (direct(mlp.gate_proj), direct(mlp.up_proj))
        qkv_parts = (qkv,) if qkv is not None else tuple(direct(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        products.append(LayerProducts(qkv_parts, direct(attn.o_proj), mlp_parts, direct(mlp.down_proj) if mlp_parts else None))
    return [*products, direct(lm_head)]


def fused_product(modules, rows: int, bf16_ok: bool, ways: frozenset[str]) -> Product | None:
    """One Product for `modules` (q/k/v, or gate/up) for a call of `rows` rows, their outputs side by side in that
    order, where they run one of `ways`; None where they must run apart (module docstring; fused_decode_weight reads
    the autocast state)."""
    bases = [linear_base(m) for m in modules]
    if any(b is None for b in bases):
        return None
    got = fused_decode_weight(bases, rows, bf16_ok, ways)
    return None if got is None else Product(got[0], got[1], sum(b.out_features for b in bases), got[2])
