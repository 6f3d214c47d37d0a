"""What transformers calls the KV-cache argument of a model's forward, and the layers of a prefilled cache as
the DynamicLayers holding keys/values that they are."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers.cache_utils import DynamicLayer


def cache_kwarg(model) -> str:
    """transformers >= 5.2x names the KV-cache argument `cache` (`past_key_values` is deprecated there);
    older releases `past_key_values`. A peft wrapper's forward takes **kwargs and hands them to the
    model it wraps, so that model's forward is the one asked."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def dynamic_layer(layer: object) -> DynamicLayer:
    """A cache layer as the DynamicLayer it is. transformers types Cache.layers as a union that also holds
    linear-attention and dummy layers, which keep no keys/values; the layers rlvr reads or rebuilds one by one are
    an attention model's, and every dynamic attention layer (full, sliding, hybrid) derives from DynamicLayer."""
    from transformers.cache_utils import DynamicLayer

    assert isinstance(layer, DynamicLayer), f"a cache layer without keys/values: {type(layer).__name__}"
    return layer


def prefilled_kv(layer: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values [B, H, P, D] the prefill wrote into a cache layer (typed Optional by transformers:
    None before a layer's first update)."""
    d = dynamic_layer(layer)
    assert d.keys is not None and d.values is not None, "the prefill has written every layer"
    return d.keys, d.values
