"""The model's forward as the hf decodes use it: the generation mode, the prefill that starts every
decode, and the prompt's left padding as an attention bias."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from transformers import DynamicCache

from rlvr.models.forward import eval_mode
from rlvr.models.kv_cache import cache_kwarg
from rlvr.models.lora_merge import compute_dtype, merged_lora_in
from rlvr.models.packed_linears import packed_linears_in
from rlvr.rollout.episodes import pad_rows


@contextlib.contextmanager
def generation_mode(model, attention: str | None = None, merge_lora: bool = True, keep_merged: bool = False) -> Iterator[None]:
    """The model in eval mode inside the block, with the attention function registered as `attention`
    (rlvr.rollout.engines.hf.engine registers the decode's; None: the model's own); both as they were after it.
    `merge_lora`: LoRA adapters run merged into their base weights (rlvr.models.lora_merge; `keep_merged` keeps
    the merged weights for the next block while the weights do not change). On the CPU the decode's products run
    from pre-packed weights (rlvr.models.packed_linears; `keep_merged` keeps those too)."""
    impl = model.config._attn_implementation
    merged = merged_lora_in(model, compute_dtype(model), keep=keep_merged) if merge_lora else contextlib.nullcontext()
    with eval_mode(model), merged, packed_linears_in(model, keep=keep_merged):
        if attention is not None:
            model.config._attn_implementation = attention
        try:
            yield
        finally:
            model.config._attn_implementation = impl


@dataclass
class Prefill:
    """The prompts run once: what every decode continues from."""

    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P]
    cache: DynamicCache  # the prompts' keys/values, [B, H, P, D] per layer
    logits: torch.Tensor  # [B x G, V] fp32: each of the G rows of a prompt starts from its prompt's next-token logits


# decode loops under torch.inference_mode rather than only no_grad: their ops skip the version counters and view tracking
# autograd keeps for tensors it may see later (a small model's decode step is hundreds of small ops). Only tensors made
# inside are inference tensors; what training reads later (ids, log-probs) is made before the loop or leaves as Python.
INFERENCE_MODE = True  # False: no_grad only (bench/inference_mode_ab.py's "before")


def decode_mode() -> contextlib.AbstractContextManager:
    # not inference_mode(False): that turns grad mode on inside the caller's no_grad
    return torch.inference_mode() if INFERENCE_MODE else contextlib.nullcontext()


def prefill(model, tokenizer, prompts: Sequence[str] | Sequence[Sequence[int]], group_size: int) -> Prefill:
    """Tokenize the prompts (left-padded, no special tokens added: the chat template wrote them), or take
    them as token ids already (a generation server's requests), and run each once, whatever the number
    of samples it gets."""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
        logits_to_keep=1,
        **{cache_kwarg(model): cache},
    )
    return Prefill(prompt_ids, prompt_mask, cache, out.logits[:, -1].float().repeat_interleave(group_size, 0))


def tokenize_prompts(tokenizer, prompts: Sequence[str] | Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, P], mask [B, P]) left-padded with the pad token; token-id prompts are padded as the tokenizer pads text."""
    if prompts and not isinstance(prompts[0], str):
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        return pad_rows([list(p) for p in prompts], pad, left=True)  # type: ignore[arg-type]
    enc = tokenizer(list(prompts), padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


def padding_bias(prompt_mask: torch.Tensor, dtype: torch.dtype, fill: float | None = None) -> torch.Tensor:
    """[B, 1, 1, P] added to the attention scores over the prompt: 0 on its tokens, `fill` (default the
    dtype's lowest finite value) on its left padding."""
    bias = torch.zeros(*prompt_mask.shape[:1], 1, 1, prompt_mask.shape[1], dtype=dtype, device=prompt_mask.device)
    return bias.masked_fill(prompt_mask[:, None, None, :] == 0, torch.finfo(dtype).min if fill is None else fill)


def cpu_bf16_autocast(model) -> bool:
    """The model runs on CPU under bf16 autocast: the decodes then keep their KV cache in fp32
    (rlvr.rollout.engines.hf.attention says why)."""
    return (
        next(model.parameters()).device.type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
    )
