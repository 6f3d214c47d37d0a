"""LoRA / QLoRA adapters through peft, gradient checkpointing, and the reference policy.

peft injects the adapter layers into the transformers model in place: the trainer keeps
training and generating with that model (`Policy.model`), and `Policy.peft` (the PeftModel
around it) saves the adapter and switches it off. With a KL penalty the reference policy is
the same weights with the adapter disabled (`reference()`), never a second copy.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from rlvr.models.forward import disable_dropout
from rlvr.models.loading import ModelError, frozen_copy, load_model

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel


@dataclass
class Policy:
    model: PreTrainedModel  # the transformers model that trains and generates (adapters injected when LoRA)
    peft: PeftModel | None  # the PeftModel wrapping it, or None (full fine-tune)
    ref_model: PreTrainedModel | None  # full fine-tune with beta > 0: a frozen copy; otherwise None

    @contextlib.contextmanager
    def reference(self):
        """The model to run for reference log-probs: the frozen copy, or (LoRA) the same model
        with its adapter disabled for the duration of the block."""
        if self.peft is not None:
            with self.peft.disable_adapter():
                yield self.model
        else:
            yield self.ref_model

    @torch.no_grad()
    def sync_reference(self, alpha: float) -> None:
        """ref = alpha x policy + (1 - alpha) x ref, parameter by parameter (TR-DPO's soft update, in TRL's order of
        operations: ref x (1 - alpha) + policy x alpha). Full fine-tunes only: the frozen copy moves."""
        assert self.ref_model is not None, "validation: algo.ref_sync_steps needs algo.beta > 0 and no LoRA"
        for ref, param in zip(self.ref_model.parameters(), self.model.parameters(), strict=True):
            ref.mul_(1.0 - alpha).add_(param.to(ref.dtype), alpha=alpha)

    def save(self, path: Path, state_dict: dict | None = None) -> None:
        """The trained weights: the adapter (adapter_model.safetensors + adapter_config.json) with
        LoRA, the whole model otherwise. `state_dict`: FSDP2's gathered full weights."""
        m = self.peft or self.model
        # peft annotates save_directory as str; it is only joined with os.path, so a Path works as for transformers
        m.save_pretrained(path) if state_dict is None else m.save_pretrained(path, state_dict=state_dict)  # type: ignore[arg-type]

    def save_merged(self, path: Path) -> None:
        """Base weights with the adapter merged in, loadable without peft. Leaves the model as is."""
        import copy

        assert self.peft is not None, "validation: model.lora.save_merged needs LoRA (model.lora.r > 0)"
        merged = copy.deepcopy(self.peft).merge_and_unload()
        merged.save_pretrained(path)

    def adapter_state_by_name(self, path: Path) -> dict:
        """A saved adapter's tensors under the PeftModel's own parameter names (the file leaves
        out the adapter name, as `get_peft_model_state_dict` writes it), for loading into FSDP2
        shards, which `set_peft_model_state_dict` cannot do."""
        from safetensors.torch import load_file

        saved = load_file(path / "adapter_model.safetensors")
        assert self.peft is not None, "only a LoRA run resumes an adapter"
        adapter = self.peft.active_adapter
        names = {n.replace(f".{adapter}", ""): n for n, p in self.peft.named_parameters() if p.requires_grad}
        if unknown := [k for k in saved if k not in names]:
            raise RuntimeError(f"resume: adapter in {path} does not match the model (unexpected {unknown[:3]})")
        if missing := [k for k in names if k not in saved]:
            raise RuntimeError(f"resume: adapter in {path} does not match the model (missing {missing[:3]})")
        return {names[k]: v for k, v in saved.items()}

    def load_adapter_weights(self, path: Path) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        result = set_peft_model_state_dict(self.peft, load_file(path / "adapter_model.safetensors"))
        if unexpected := getattr(result, "unexpected_keys", None):
            raise RuntimeError(f"resume: adapter in {path} does not match the model (unexpected {unexpected[:3]})")


def load_policy(mcfg, device: torch.device, *, beta: float) -> Policy:
    """The policy per the `model` config: optional k-bit base (QLoRA), adapters, checkpointing."""
    lo = mcfg.lora
    quant = None
    if lo.quantize != "none":
        try:
            from transformers import BitsAndBytesConfig
        except ImportError as e:  # pragma: no cover
            raise ModelError("model.lora.quantize needs transformers with bitsandbytes support") from e
        quant = (
            BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
            if lo.quantize == "4bit"
            else BitsAndBytesConfig(load_in_8bit=True)
        )
    model = load_model(mcfg.path, mcfg.dtype, device, mcfg.trust_remote_code, gguf_file=mcfg.gguf_file, quantization_config=quant)
    if mcfg.disable_dropout:  # before the reference is copied from it
        disable_dropout(model)
    if mcfg.gradient_checkpointing:
        # Non-reentrant: works with frozen inputs (LoRA), DDP and FSDP2; only active in train().
        if hasattr(model, "activation_checkpointing_enable"):  # the name in transformers >= 5.2x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lo.r == 0:
        model.train()
        return Policy(model, None, frozen_copy(model) if beta > 0 else None)
    try:
        import peft
    except ImportError:
        raise ModelError("model.lora.r > 0 needs peft: pip install 'rlvr[lora]'") from None
    if quant is not None:
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=mcfg.gradient_checkpointing)
    targets = lo.target_modules[0] if list(lo.target_modules) == ["all-linear"] else list(lo.target_modules)
    config = peft.LoraConfig(r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout, target_modules=targets, task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # peft 0.21 asks transformers 5's model for its old checkpointing name, every run
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        wrapped = peft.get_peft_model(model, config)
    if mcfg.disable_dropout:  # the adapters' own dropout too
        disable_dropout(wrapped)
    # the same modules, adapters injected, base weights frozen (peft types it a Module: it is the model passed in)
    base = cast("PreTrainedModel", wrapped.get_base_model())
    base.train()
    return Policy(base, wrapped, None)
