"""What transformers calls the KV-cache argument of a model's forward."""

from __future__ import annotations

import inspect


def cache_kwarg(model) -> str:
    """transformers >= 5.2x names the KV-cache argument `cache` (`past_key_values` is deprecated there);
    older releases `past_key_values`. A peft wrapper's forward takes **kwargs and hands them to the
    model it wraps, so that model's forward is the one asked."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
