"""The single-turn decode's step: the next-token logits of every row still decoding, after the prefill.

The layout of the KV cache is chosen before the prefill (the prefill's attention depends on it):
  * lean: Llama-family models, the step of rlvr.rollout.engines.hf.lean_decode on buffers of its own
    (the prompt's keys/values once per group for long prompts, repeated into every row for short ones);
  * shared prefix: any model with plain full causal attention, through its own forward, the prompt's
    keys/values once per group (rlvr.rollout.engines.hf.shared_prefix);
  * repeated: any other model, the prompt's keys/values repeated into every row, in buffers allocated
    once (rlvr.rollout.engines.hf.kv_buffers), or concatenated per token without static buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlvr.models.kv_cache import cache_kwarg, dynamic_layer, prefilled_kv
from rlvr.rollout.engines.hf.compiled_decode import CompiledLayers
from rlvr.rollout.engines.hf.forward import Prefill, cpu_bf16_autocast, padding_bias
from rlvr.rollout.engines.hf.kv_buffers import BufferedLayer
from rlvr.rollout.engines.hf.lean_decode import DecodeState, LeanDecoder, lean_decoder_for
from rlvr.rollout.engines.hf.shared_prefix import PrefixState, SharedPrefixLayer, supports_shared_prefix

# Below this many prompt tokens the lean decode repeats the prompt's KV into every row's buffer:
# one attention call over [prompt + own] costs less than two calls and a merge (each fused call
# has a fixed cost on CPU that short prompts do not repay).
SHARED_PREFIX_MIN_PROMPT = 32
# From SHARED_PREFIX_MIN_PROMPT to this many prompt tokens the eager CPU step times both layouts at the decode's shapes
# and keeps the faster (decode_attention.decode_attention_way); longer prompts are kept once per group. On an AMD EPYC
# the repeated layout's attention took 0.75-0.8x the shared one's at 32-80 prompt tokens with 2 kv heads of 40 (in
# bf16 from 64), 0.94x at 32 with 8 heads of 64; config F's generation on 75-token prompts 0.92x
# (bench/results/decode_layout_amd.md).
SHARED_PREFIX_TIMED_MAX = 128


@dataclass(frozen=True)
class Layout:
    """How one single-turn decode keeps its KV cache."""

    lean: LeanDecoder | None  # the Llama-family step, or None: the model's own forward
    shared: bool  # the model's own forward with the prompt's keys/values once per group
    share_prompt: bool  # the lean step may keep the prompt once per group too (long prompts, G > 1)
    static: bool  # buffers allocated once for the whole decode
    cache_dtype: torch.dtype | None  # fp32 under bf16 autocast on CPU (rlvr.rollout.engines.hf.attention), else the model's

    @property
    def attention(self) -> str | None:
        """The attention function the prefill and decode run with (registered by rlvr.rollout.engines.hf.engine)."""
        if self.shared:
            return "rlvr_prefix"
        return "rlvr_sdpa" if self.cache_dtype is not None else None


def choose_layout(
    model, group_size: int, *, static: bool, shared_prefix: bool, lean: bool, compiled: CompiledLayers | None = None
) -> Layout:
    """The fastest layout the model and the engine's settings allow (read before the attention is swapped);
    `compiled`: the lean step's compiled layers (rollout.compile), or None."""
    fp32_cache = static and cpu_bf16_autocast(model) and model.config._attn_implementation == "sdpa"
    decoder = lean_decoder_for(model, compiled) if static and lean else None
    shared = decoder is None and static and shared_prefix and group_size > 1 and supports_shared_prefix(model.config)
    return Layout(decoder, shared, shared_prefix and group_size > 1, static, torch.float32 if fp32_cache else None)


def start_decode(model, pre: Prefill, layout: Layout, group_size: int, max_new_tokens: int) -> "TransformersStep | LeanStep":
    """The step that continues the prefill's cache for group_size rows per prompt, up to max_new_tokens each."""
    G, T, cache = group_size, max_new_tokens, pre.cache
    B, P = pre.prompt_ids.shape
    if layout.lean is not None:
        share = layout.share_prompt and P >= SHARED_PREFIX_MIN_PROMPT
        shared = None if share and P <= SHARED_PREFIX_TIMED_MAX else share  # None: timed (decode_attention_way)
        return LeanStep(layout.lean, layout.lean.start(cache, pre.prompt_mask, G, T, layout.cache_dtype, shared=shared))
    if layout.shared:  # prompt K/V stay once per prompt; each sample's tokens get their own buffer
        bias = padding_bias(pre.prompt_mask, layout.cache_dtype or prefilled_kv(cache.layers[0])[0].dtype)  # the prefix keys' dtype
        for i, layer in enumerate(cache.layers):
            cache.layers[i] = SharedPrefixLayer(dynamic_layer(layer), G, T, layout.cache_dtype)
        state = PrefixState(cache, torch.arange(B * G, device=pre.prompt_ids.device), G, bias)
        return TransformersStep(model, cache, None, {"rlvr_prefix": state})  # the prefix bias and lockstep decode need no mask
    _repeat_and_preallocate(cache, G, P + T if layout.static else None, layout.cache_dtype)
    return TransformersStep(model, cache, pre.prompt_mask.repeat_interleave(G, 0), {})


def _repeat_and_preallocate(cache: DynamicCache, repeats: int, capacity: int | None, dtype=None) -> None:
    """Repeat every row `repeats` times; with a capacity, plain full-attention layers become buffered
    ones, in `dtype` when given (others, e.g. sliding-window layers, are repeated and keep concatenating)."""
    for i, layer in enumerate(cache.layers):
        if capacity is not None and type(layer) is DynamicLayer and layer.is_initialized:
            cache.layers[i] = BufferedLayer(layer, capacity, repeats, dtype)
        else:
            # transformers' layer mixins do not declare it; the dynamic and dummy layers a DynamicCache holds define it
            layer.batch_repeat_interleave(repeats)  # type: ignore[union-attr]


class TransformersStep:
    """The decode step through the model's own forward and a transformers cache (any architecture)."""

    def __init__(self, model, cache, attn_mask, extra: dict):
        self.model, self.cache, self.attn_mask, self.extra, self.ckw = model, cache, attn_mask, extra, cache_kwarg(model)

    def select(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        if self.attn_mask is not None:
            self.attn_mask = self.attn_mask[keep]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if self.attn_mask is not None:
            self.attn_mask = torch.cat([self.attn_mask, torch.ones_like(self.attn_mask[:, :1])], dim=1)
        if "rlvr_prefix" in self.extra:
            self.extra["rlvr_prefix"].rows = rows
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.attn_mask,
            position_ids=positions[:, None],
            **{self.ckw: self.cache},
            use_cache=True,
            **self.extra,
        )
        return out.logits[:, -1].float()


class LeanStep:
    """The decode step of rlvr.rollout.engines.hf.lean_decode (Llama-family models)."""

    def __init__(self, decoder: LeanDecoder, state: DecodeState):
        self.decoder, self.state = decoder, state

    def select(self, keep: torch.Tensor) -> None:
        self.state.select(keep)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.decoder.step(tokens, positions, self.state)
