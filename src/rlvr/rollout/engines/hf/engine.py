"""Generation with any Hugging Face causal LM, on CPU or GPU, without `generate()`.

A lean decode loop: each prompt is prefilled once and its KV cache shared by its G samples
(the prompt is never run G times), rows that have finished leave the decode batch, and the
sampling noise of prompt i comes from a generator seeded by seeds[i] alone, so a completion
does not depend on which other prompts share the batch.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rlvr.models.kv_cache import cache_kwarg
from rlvr.rollout.engines.protocols import Generation, SamplingParams, sample_tokens
from rlvr.rollout.engines.hf.attention import sdpa_cache_dtype
from rlvr.rollout.engines.hf.episode_cache import episode_attention
from rlvr.rollout.engines.hf.episode_decode import decode_episodes
from rlvr.rollout.engines.turns import Trace, TurnDriver
from rlvr.rollout.engines.hf.kv_buffers import BufferedLayer
from rlvr.rollout.engines.hf.lean_decode import DecodeState, LeanDecoder, lean_decoder_for
from rlvr.rollout.engines.hf.shared_prefix import PrefixState, SharedPrefixLayer, shared_prefix_attention, supports_shared_prefix


AttentionInterface.register("rlvr_sdpa", sdpa_cache_dtype)
# transformers builds no attention mask at all for an attention name it has no mask function for:
# without this line the left padding of shorter prompts was attended to (found by
# tests/test_rollout.py::test_bf16_autocast_decode_respects_prompt_padding).
AttentionMaskInterface.register("rlvr_sdpa", sdpa_mask)
AttentionInterface.register("rlvr_prefix", shared_prefix_attention)
AttentionMaskInterface.register("rlvr_prefix", sdpa_mask)  # the prefill is plain masked SDPA
AttentionInterface.register("rlvr_episode", episode_attention)
AttentionMaskInterface.register("rlvr_episode", sdpa_mask)


# Below this many prompt tokens the lean decode repeats the prompt's KV into every row's buffer:
# one attention call over [prompt + own] costs less than two calls and a merge (each fused call has
# ~150 us of fixed cost on CPU; 10-token prompts, 64 rows: 370 vs 520 us per layer and token).
SHARED_PREFIX_MIN_PROMPT = 32


def _repeat_and_preallocate(cache: DynamicCache, repeats: int, capacity: int | None, dtype=None) -> None:
    """Repeat every row `repeats` times; with a capacity, plain full-attention layers become buffered
    ones, in `dtype` when given (others, e.g. sliding-window layers, are repeated and keep concatenating)."""
    for i, layer in enumerate(cache.layers):
        if capacity is not None and type(layer) is DynamicLayer and layer.is_initialized:
            cache.layers[i] = BufferedLayer(layer, capacity, repeats, dtype)
        else:
            layer.batch_repeat_interleave(repeats)


class _TransformersDecode:
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
        out = self.model(input_ids=tokens[:, None], attention_mask=self.attn_mask, position_ids=positions[:, None],
                         **{self.ckw: self.cache}, use_cache=True, **self.extra)
        return out.logits[:, -1].float()


class _LeanDecode:
    """The decode step of rlvr.rollout.engines.hf.lean_decode (Llama-family models)."""

    def __init__(self, decoder: LeanDecoder, state: DecodeState):
        self.decoder, self.state = decoder, state

    def select(self, keep: torch.Tensor) -> None:
        self.state.select(keep)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.decoder.step(tokens, positions, self.state)


class HFEngine:
    """Generation engine for transformers causal LMs (the model is shared with the trainer)."""

    def __init__(self, model, tokenizer, drop_finished_fraction: float = 0.25, static_cache: bool = True, shared_prefix: bool = True,
                 lean: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.drop_finished_fraction = drop_finished_fraction
        self.static_cache = static_cache
        self.shared_prefix = shared_prefix  # decode reads each prompt's KV once per group (rollout/shared_prefix.py)
        self.lean = lean  # Llama-family models decode with rollout/lean_decode.py (static_cache only)

    def sync_weights(self) -> None:  # same module as the trainer's: nothing to copy
        pass

    @torch.no_grad()  # not inference_mode: the trainer's forward reuses these ids under autograd
    def generate(self, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int]) -> Generation:
        model = self.model
        if len(seeds) != len(prompts):
            raise ValueError(f"need one seed per prompt, got {len(seeds)} for {len(prompts)} prompts")
        was_training, attn_impl = model.training, model.config._attn_implementation
        model.eval()
        try:
            return self._generate(prompts, params, seeds)
        finally:
            model.config._attn_implementation = attn_impl
            if was_training:
                model.train()

    @torch.no_grad()
    def generate_episodes(self, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int],
                          driver: TurnDriver) -> tuple[torch.Tensor, torch.Tensor, list[Trace]]:
        """Multi-turn episodes (rlvr.rollout.engines.hf.episode_decode): params.n per prompt, each continuing from
        its KV cache between turns. Needs plain causal full attention (supports_shared_prefix)."""
        model = self.model
        if not supports_shared_prefix(model.config):
            raise ValueError("multi-turn episodes with the hf engine need a model with plain full causal attention and "
                             f"attn_implementation=sdpa (got {model.config._attn_implementation!r}, or sliding windows / soft-capping)")
        device = next(model.parameters()).device
        fp32_cache = device.type == "cpu" and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        was_training, attn_impl = model.training, model.config._attn_implementation
        model.eval()
        model.config._attn_implementation = "rlvr_episode"
        try:
            return decode_episodes(model, self.tokenizer, prompts, params, seeds, driver, cache_dtype=torch.float32 if fp32_cache else None)
        finally:
            model.config._attn_implementation = attn_impl
            if was_training:
                model.train()

    def _generate(self, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int]) -> Generation:
        tok, model = self.tokenizer, self.model
        device = next(model.parameters()).device
        G, T = params.n, params.max_new_tokens
        enc = tok(list(prompts), padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
        prompt_ids = enc["input_ids"].to(device)  # [B, P]
        prompt_mask = enc["attention_mask"].to(device)  # [B, P]
        decoder, logits = self._prefill(prompt_ids, prompt_mask, G, T)  # logits [B x G, V]
        gens = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
        completion, logprobs, entropies = self._decode(decoder, logits, prompt_mask.sum(-1).repeat_interleave(G, 0), params, gens)
        return self._generation(prompt_ids, prompt_mask, completion, logprobs, entropies, params)

    def _prefill(self, prompt_ids, prompt_mask, G: int, T: int):
        """Run the prompts once; (the decoder that continues them, the first logits [B x G, V])."""
        model, device = self.model, prompt_ids.device
        B, P = prompt_ids.shape
        cache, ckw = DynamicCache(config=model.config), cache_kwarg(model)
        # bf16 autocast on CPU: keep the decode's KV cache in fp32 (see rlvr.rollout.engines.hf.attention)
        fp32_cache = self.static_cache and device.type == "cpu" and torch.is_autocast_enabled("cpu") \
            and torch.get_autocast_dtype("cpu") == torch.bfloat16 and model.config._attn_implementation == "sdpa"
        cache_dtype = torch.float32 if fp32_cache else None
        lean = lean_decoder_for(model) if self.static_cache and self.lean else None
        shared = lean is None and self.static_cache and self.shared_prefix and G > 1 and supports_shared_prefix(model.config)
        if shared:
            model.config._attn_implementation = "rlvr_prefix"
        elif fp32_cache:
            model.config._attn_implementation = "rlvr_sdpa"
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
                    **{ckw: cache}, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1].float().repeat_interleave(G, 0)  # [N, V]
        if lean is not None:
            layout_shared = self.shared_prefix and G > 1 and P >= SHARED_PREFIX_MIN_PROMPT
            return _LeanDecode(lean, lean.start(cache, prompt_mask, G, T, cache_dtype, shared=layout_shared)), logits
        extra = {}
        if shared:  # prompt K/V stay once per prompt; each sample's tokens get their own buffer
            for i, layer in enumerate(cache.layers):
                cache.layers[i] = SharedPrefixLayer(layer, G, T, cache_dtype)
            kdtype = cache.layers[0].prefix_keys.dtype
            bias = torch.zeros(B, 1, 1, P, dtype=kdtype, device=device)
            bias = bias.masked_fill(prompt_mask[:, None, None, :] == 0, torch.finfo(kdtype).min)
            extra["rlvr_prefix"] = PrefixState(cache, torch.arange(B * G, device=device), G, bias)
        else:
            _repeat_and_preallocate(cache, G, P + T if self.static_cache else None, cache_dtype)
        # shared: the prefix bias and lockstep decode need no mask
        return _TransformersDecode(model, cache, None if shared else prompt_mask.repeat_interleave(G, 0), extra), logits

    def _decode(self, decoder, logits, next_pos, params: SamplingParams, gens):
        """Sample up to T tokens per row: (completion ids, their log-probs, entropies or None), each [N, T].
        Finished rows keep their shape until a quarter of the rows still decoding have finished,
        then leave the batch together: a few compactions per decode, not one per token."""
        N, T, G, device = logits.shape[0], params.max_new_tokens, params.n, logits.device
        completion = torch.full((N, T), self.tokenizer.pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((N, T), dtype=torch.float32, device=device)
        entropies = torch.zeros((N, T), dtype=torch.float32, device=device) if params.temperature > 0 else None
        finished = torch.zeros(N, dtype=torch.bool, device=device)
        active = torch.arange(N, device=device)  # rows still in the decode batch
        eos = self.tokenizer.eos_token_id
        for t in range(T):
            token, logp, entropy = self._sample(logits, params, gens, active, G)
            completion[active, t] = token
            logprobs[active, t] = logp
            if entropies is not None:
                entropies[active, t] = entropy
            if not params.ignore_eos:
                finished[active] |= token == eos
            if t == T - 1 or bool(finished.all()):
                break
            live = ~finished[active]
            if live.numel() - int(live.sum()) >= max(1, int(self.drop_finished_fraction * live.numel())):
                keep = live.nonzero().squeeze(-1)
                decoder.select(keep)
                active, token, next_pos = active[keep], token[keep], next_pos[keep]
            logits = decoder.step(token, next_pos, active)
            next_pos = next_pos + 1
        return completion, logprobs, entropies

    def _generation(self, prompt_ids, prompt_mask, completion, logprobs, entropies, params: SamplingParams) -> Generation:
        G, T, eos, pad = params.n, params.max_new_tokens, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        mask = self._completion_mask(completion, eos, params.ignore_eos)
        completion = completion.masked_fill(mask == 0, pad)
        truncated = mask.sum(-1) == T
        if not params.ignore_eos:
            truncated &= completion[:, -1] != eos
        return Generation(
            prompt_ids=prompt_ids.repeat_interleave(G, 0),
            prompt_mask=prompt_mask.repeat_interleave(G, 0),
            completion_ids=completion,
            completion_mask=mask,
            sampling_logprobs=logprobs * mask,
            truncated=truncated,
            texts=self.tokenizer.batch_decode(completion, skip_special_tokens=True),
            sampling_entropy=None if entropies is None else entropies * mask,
        )

    @staticmethod
    def _completion_mask(completion: torch.Tensor, eos: int, ignore_eos: bool) -> torch.Tensor:
        """1 on every token up to and including the first EOS."""  # [N, C]
        if ignore_eos:
            return torch.ones_like(completion)
        is_eos = completion == eos
        after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0
        return (~after_eos).long()

    @staticmethod
    def _sample(logits, params: SamplingParams, gens, active, G):
        """(token, its log-prob, the entropy of the distribution) per active row (entropy None when greedy).
        Row r's random number comes from its prompt's generator, which draws one for each of its G
        rows every step: a row's sample does not depend on which rows have left the batch."""
        if params.temperature == 0:
            token = logits.argmax(-1)
            return token, torch.zeros_like(token, dtype=torch.float32), None
        uniforms = torch.cat([torch.rand(G, generator=g, device=logits.device) for g in gens])  # [B x G]
        return sample_tokens(logits, uniforms[active], temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
