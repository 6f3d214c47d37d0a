"""The bundled tiny model with peft LoRA adapters, for the LoRA tests (tests/models/test_lora_*.py)."""

from __future__ import annotations

import torch

from rlvr.models.loading import load_model


def tiny_lora(model_dir, r: int = 4, alpha: int = 8, **config):
    """The tiny model with LoRA on every projection (fp32, CPU), its adapters moved off their no-op init (B = 0)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = load_model(model_dir, "float32", torch.device("cpu"), False)
    model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules="all-linear", **config))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    return model


def adapted(model) -> list:
    """The model's LoRA-wrapped layers."""
    return [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
