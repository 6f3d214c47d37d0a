"""Attention for the training forward on the CPU: short sequences by explicit products.

torch's CPU flash-attention kernel (what SDPA runs there) is slow in the backward of short sequences: for 64 rows of
72 tokens (12 heads of 64, 4 kv heads, bf16 autocast) its forward + backward takes about 150 ms per layer, where the
same attention as two batched products and a softmax takes about 45 ms (bench/attention_cpu.py ->
bench/results/attention_cpu.md). Past about 150 x 150 query x key positions per head the explicit score matrices
cost more memory traffic than the kernel saves, and SDPA wins again. So the training forward (the one forward with a
gradient) computes short attention explicitly and hands everything else to transformers' SDPA function unchanged:
the no-gradient forwards, long sequences, dropout, soft-capping, other devices, torch.compile.

The math is SDPA's: softmax(q k^T x scale + mask) v, grouped-query heads reading their kv head (transformers'
repeat_kv order). In fp32 (and fp64) it equals SDPA up to rounding; under bf16 autocast the two products run in bf16
and the softmax in fp32, as transformers' eager attention does there (SDPA's kernel keeps its scores in fp32: both
are bf16 approximations, tests/models/test_training_attention.py holds this one as close to the fp32 truth). A query
position whose keys are all masked (left padding) gets a uniform average instead of SDPA's zeros: its output only
ever reaches other padding positions, whose log-probs are cut before the loss, so real tokens' log-probs and every
gradient are the same.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rlvr.models import prefix_attention

NAME = "rlvr_train"
# query x key positions per head up to which the explicit products beat the flash kernel, forward + backward under
# bf16 autocast (bench/results/attention_cpu.md: 0.2-0.4x its time up to 96 x 96, 0.4-0.6x at 128 x 128, 0.6-1.1x at
# 160 x 160, slower beyond)
EXPLICIT_MAX_SCORES = 128 * 160
# and up to this many scores in all (rows x heads x Lq x Lk): autograd keeps each layer's attention weights for the
# backward, ~6 bytes a score (fp32 softmax output, its bf16 copy), where the kernel keeps one log-sum-exp per query
EXPLICIT_MAX_ELEMENTS = 2**24


def _explicit_pays(query: torch.Tensor, Lk: int, Hkv: int, dropout: float, kwargs: dict, *, per_head_bound: bool = True) -> bool:
    """Whether the explicit products run this call: query [B, H, Lq, D] over Lk keys of Hkv heads."""
    Lq = query.shape[2]
    return (
        query.device.type == "cpu"
        and query.requires_grad
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and dropout == 0.0
        and (not per_head_bound or Lq * Lk <= EXPLICIT_MAX_SCORES)
        and query.shape[0] * query.shape[1] * Lq * Lk <= EXPLICIT_MAX_ELEMENTS
        and query.shape[1] % Hkv == 0
        and not any(kwargs.get(k) is not None for k in ("softcap", "sliding_window", "position_bias", "s_aux", "sinks"))
    )


def explicit_attention(
    query: torch.Tensor,  # [B, H, Lq, D]
    key: torch.Tensor,  # [B, Hkv, Lk, D]
    value: torch.Tensor,  # [B, Hkv, Lk, D]
    attention_mask: torch.Tensor | None,  # [B or 1, 1, Lq, Lk]: bool (True = attend) or additive; None = causal
    scale: float,
) -> torch.Tensor:
    """softmax(q k^T x scale + mask) v, [B, Lq, H, D] (transformers' layout). The softmax runs in fp32 (fp64 for fp64
    inputs); the products in fp32 too, or in autocast's dtype under autocast, where the output stays in it (as SDPA's)."""
    B, H, Lq, D = query.shape
    Hkv, Lk = key.shape[1], key.shape[2]
    rep, dtype = H // Hkv, torch.promote_types(query.dtype, torch.float32)
    # the scale on the queries and the mask as an added bias: the score matrices (the largest tensors here) get one
    # elementwise pass forward and none backward (an add passes its gradient through), where scaling the scores and
    # masked_fill took two forward and two backward
    q = query.to(dtype).reshape(B, Hkv, rep * Lq, D) * scale  # a kv head's queries together (a copy: query is transposed)
    s = torch.matmul(q, key.to(dtype).transpose(-1, -2)).view(B, Hkv, rep, Lq, Lk)  # [B, Hkv, rep, Lq, Lk]
    if attention_mask is None and Lq > 1:
        attention_mask = torch.ones(Lq, Lk, dtype=torch.bool, device=query.device).tril()[None, None]
    if attention_mask is not None:
        s = s + prefix_attention.additive_bias(attention_mask, s.dtype)[:, :, None]  # [B or 1, 1, 1, Lq, Lk]
    p = torch.softmax(s, dim=-1, dtype=dtype).view(B, Hkv, rep * Lq, Lk)
    out = torch.matmul(p, value.to(dtype)).view(B, H, Lq, D).transpose(1, 2)
    return out.contiguous() if torch.is_autocast_enabled(query.device.type) else out.to(query.dtype).contiguous()


def training_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention-function contract: explicit products where they pay (module docstring), else SDPA;
    inside prefix_attention.shared_prefix, over the group's prompt as well."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if (prefix := prefix_attention.take(module)) is not None:
        prefix_keys, prefix_values, prefix_mask, G = prefix
        # no bound per head: the prompt's products are large ones here, and the kernel would take the repeated keys;
        # under autocast the repeated keys (explicit_attention's products in autocast's dtype, as measured there)
        Lk, autocast = prefix_keys.shape[2] + key.shape[2], torch.is_autocast_enabled(query.device.type)
        if not autocast and _explicit_pays(query, Lk, key.shape[1], dropout, kwargs, per_head_bound=False):
            out = prefix_attention.grouped_prefix_attention(query, key, value, attention_mask, *prefix[:3], scale)  # keys, values, mask
            return out, None
        key, value, attention_mask = prefix_attention.repeated(key, value, attention_mask, prefix_keys, prefix_values, prefix_mask, G)
    # a mask, or None for causal over equal lengths or one query
    known_mask = attention_mask is not None or query.shape[2] in (1, key.shape[2])
    if not (known_mask and _explicit_pays(query, key.shape[2], key.shape[1], dropout, kwargs)):
        kwargs.update(dropout=dropout, scaling=scaling, is_causal=is_causal)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return explicit_attention(query, key, value, attention_mask, scale), None


AttentionInterface.register(NAME, training_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks SDPA gets


def activation_checkpointing(model) -> bool:
    """Whether the model recomputes its forward in the backward (transformers' activation/gradient checkpointing)."""
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.2x; before, its old name
    return bool(getattr(model, "is_gradient_checkpointing", False) if checkpointing is None else checkpointing)


@contextlib.contextmanager
def short_attention_explicit(model) -> Iterator[None]:
    """Inside the block a model that runs SDPA runs `training_attention` (the same math); others as they are, and so
    does a model under gradient checkpointing: its backward recomputes the forward after the block, with SDPA, and
    keeping the attention weights is what checkpointing is there to avoid."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if config is None or impl != "sdpa" or activation_checkpointing(model):
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = impl
