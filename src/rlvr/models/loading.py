"""Load a policy (and, when needed, a frozen reference) with its tokenizer."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from rlvr import live
from rlvr.hub import cached_snapshot, is_cached, looks_like_hub_id, offline_reason
from rlvr.models import resolve_model_path

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(ValueError):
    """The model or tokenizer cannot be used; the message says why and what to do."""


def resolve_existing(path: str, what: str = "model.path") -> str:
    """The folder or hub id to load. A path must exist; a hub id must be in the local cache or the
    hub reachable (checked in seconds, instead of a minute of retries ending in HF's own error). A `rlvr_live:` name
    (a model object given to rlvr.GRPOTrainer) is returned as it is."""
    if live.is_live(path):
        return path
    resolved = resolve_model_path(path)
    local = Path(resolved).expanduser()
    if local.exists():
        return str(local)
    if not looks_like_hub_id(resolved):
        raise ModelError(f"{what}: folder not found: {resolved}")
    if why := offline_reason():
        if is_cached(resolved):  # the cached folder itself: transformers would ask the hub first, with a minute of retries
            return cached_snapshot(resolved)
        raise ModelError(
            f"{what}: {resolved} is not a local folder nor in the Hugging Face cache, and the hub cannot be used "
            f"({why}): download it where there is network, or give a local folder"
        )
    return resolved


def load_tokenizer(path: str, trust_remote_code: bool = False, gguf_file: str | None = None):
    from transformers import AutoTokenizer

    extra = {"gguf_file": gguf_file} if gguf_file else {}
    where = resolve_existing(path)
    if live.is_live(where):  # a tokenizer object, or a model object's (its config's name_or_path)
        tok = _live_tokenizer(where)
    else:
        tok = AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code, **extra)
    notes = []
    if tok.eos_token_id is None:
        raise ModelError(f"tokenizer of {path!r} has no eos_token: generation could never stop; set one in its tokenizer_config.json")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # padding is masked everywhere, so any id works
        notes.append(f"tokenizer of {path!r} has no pad_token: using eos_token {tok.eos_token!r} for padding")
    return tok, notes


def with_template_kwargs(tokenizer, kwargs: dict):
    """The tokenizer (a shallow copy: a caller's own object is left as it was) whose apply_chat_template passes
    `kwargs` (data.chat_template_kwargs) on every call that does not give them itself, so that prompts, tool turns
    and agents' conversations all render with them, as TRL renders each with its chat_template_kwargs."""
    if not kwargs:
        return tokenizer
    tokenizer = copy.copy(tokenizer)
    plain = tokenizer.apply_chat_template

    def apply_chat_template(*args, **given):
        return plain(*args, **{**kwargs, **given})

    tokenizer.apply_chat_template = apply_chat_template
    return tokenizer


def _live_tokenizer(spec: str):
    obj = _live(spec, "model.tokenizer")
    if hasattr(obj, "convert_tokens_to_ids"):
        return obj
    from transformers import AutoTokenizer

    name = getattr(getattr(obj, "config", None), "name_or_path", "")
    if not name or not Path(name).exists() and not looks_like_hub_id(name):
        raise ModelError(f"model.path={spec!r}: the model object does not say where its tokenizer is; pass processing_class=")
    return AutoTokenizer.from_pretrained(resolve_existing(name, what="the model object's name_or_path"))


def _live(spec: str, what: str):
    try:
        return live.get(spec, what)
    except LookupError as e:
        raise ModelError(str(e)) from None


def load_model(
    path: str,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    gguf_file: str | None = None,
    quantization_config=None,
):
    from transformers import AutoModelForCausalLM

    if gguf_file:
        from rlvr.models.gguf import load_gguf

        return load_gguf(resolve_existing(path), gguf_file, DTYPES[dtype])[0].to(device)
    where = resolve_existing(path)
    if live.is_live(where):  # trained in place, as TRL does with a model object; its own dtype
        return _live(where, "model.path").to(device)
    if quantization_config is not None:  # QLoRA: bitsandbytes places the k-bit weights itself
        return AutoModelForCausalLM.from_pretrained(
            where,
            dtype=DTYPES[dtype],
            trust_remote_code=trust_remote_code,
            quantization_config=quantization_config,
            device_map={"": device},
        )
    model = AutoModelForCausalLM.from_pretrained(where, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code)
    if torch.device(device).type == "cpu" and getattr(model, "use_kernels", False):
        # transformers 5 kernelizes from the Hub by default where `kernels` is installed: nothing of it runs on the CPU,
        # and it kernelizes the whole model again at every train()/eval() switch (1-1.5 ms each, two per generation)
        model.use_kernels = False
    # transformers wraps PreTrainedModel.to with functools.wraps(nn.Module.to), whose typing loses the bound self
    return model.to(device)  # type: ignore[arg-type]


def frozen_copy(model):
    """A reference policy: same weights, no gradients, eval mode."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
