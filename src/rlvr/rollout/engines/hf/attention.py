"""Attention for the decode under bf16 autocast (registered by rlvr.rollout.engines.hf.engine as `rlvr_sdpa`)."""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward


def sdpa_cache_dtype(module, query, key, value, attention_mask, **kwargs):
    """SDPA for the decode under autocast: autocast would cast the whole KV cache to bf16 at every
    token and layer (a full copy of the cache), and CPU bf16 attention over one query row gains
    nothing, so the attention runs with autocast off, in the cache's dtype (fp32: the decode
    allocates fp32 buffers under bf16 autocast), and its output is cast back. Elsewhere: plain SDPA."""
    if not torch.is_autocast_enabled(query.device.type):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    dtype = query.dtype
    with torch.autocast(query.device.type, enabled=False):
        out, w = sdpa_attention_forward(module, query.to(key.dtype), key, value.to(key.dtype), attention_mask, **kwargs)
    return out.to(dtype), w
