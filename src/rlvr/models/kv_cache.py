"""What transformers calls the KV-cache argument of a model's forward."""

from __future__ import annotations

import inspect


def cache_kwarg(model) -> str:
    """transformers >= 5.2x names the KV-cache argument `cache`; older releases `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
