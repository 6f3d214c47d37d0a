"""Fused projections for the lean decode step: q, k and v as one matmul, gate and up as one.

At decode shapes (one token per row) a small model's step pays per call: dispatch, reading the
normed input again, a thread fan-out that a [rows x hidden] product barely fills. One product with
the concatenated weights does the work of three (attention) and two (MLP) with the same FLOPs and
the same sums per output element. The concatenated copies are built once per version of the
weights: an optimizer step or a load bumps every parameter's version counter, and the next decode
sees the new counters and rebuilds. Under CPU autocast the copies are kept in the autocast dtype,
so the decode does not cast them every token (the per-module path casts each weight once per
autocast region too). Only layers whose projections are plain nn.Linear and whose MLP is the
Llama-family SwiGLU are fused: a LoRA-wrapped or quantised projection is called as the module it is.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch

PLAIN_MLPS = {"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"}  # down(act(gate(x)) * up(x))


class FusedLayer(NamedTuple):
    qkv_weight: torch.Tensor | None  # [Hq x D + 2 x Hkv x D, hidden], None: the projections are not plain Linear
    qkv_bias: torch.Tensor | None  # [Hq x D + 2 x Hkv x D] (qwen2), else None
    gate_up_weight: torch.Tensor | None  # [2 x intermediate, hidden], None: the MLP is not plain
    gate_up_bias: torch.Tensor | None


_BUILT: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, FusedLayer]]" = weakref.WeakKeyDictionary()


def _plain(*modules) -> bool:
    return all(type(m) is torch.nn.Linear for m in modules)


def _cat(linears, dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = torch.cat([m.weight.detach() for m in linears])
    biases = [m.bias for m in linears]
    bias = (
        None
        if all(b is None for b in biases)
        else torch.cat([b.detach() if b is not None else m.weight.new_zeros(m.out_features) for m, b in zip(linears, biases)])
    )
    if dtype is not None:
        weight, bias = weight.to(dtype), None if bias is None else bias.to(dtype)
    return weight, bias


def fused_layer(layer: Any, dtype: torch.dtype | None) -> FusedLayer:
    """The decoder layer's fused projections (in `dtype` when given), rebuilt when a weight changed since the last call."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv = (attn.q_proj, attn.k_proj, attn.v_proj) if _plain(attn.q_proj, attn.k_proj, attn.v_proj) else None
    gate_up = (
        (mlp.gate_proj, mlp.up_proj)
        if type(mlp).__name__ in PLAIN_MLPS and _plain(mlp.gate_proj, mlp.up_proj) and hasattr(mlp, "act_fn")
        else None
    )
    params = [p for group in (qkv or (), gate_up or ()) for m in group for p in m.parameters()]
    key = (dtype, tuple((id(p), p._version) for p in params))  # _version: bumped by every in-place update
    built = _BUILT.get(layer)
    if built is not None and built[0] == key:
        return built[1]
    fused = FusedLayer(*(_cat(qkv, dtype) if qkv else (None, None)), *(_cat(gate_up, dtype) if gate_up else (None, None)))
    _BUILT[layer] = (key, fused)
    return fused
