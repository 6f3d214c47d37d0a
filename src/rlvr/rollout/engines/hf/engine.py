"""Generation with any Hugging Face causal LM, on CPU or GPU, without `generate()`.

A lean decode loop: each prompt is prefilled once (forward.py) and its KV cache shared by its G
samples (the prompt is never run G times; the step and its KV layout: steps.py), rows that have
finished leave the decode batch, and the sampling noise of prompt i comes from a generator seeded
by seeds[i] alone, so a completion does not depend on which other prompts share the batch.
Multi-turn episodes decode in episode_decode.py.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rlvr.rollout.engines.hf.attention import sdpa_cache_dtype
from rlvr.rollout.engines.hf.compiled_decode import CompiledLayers
from rlvr.rollout.engines.hf.episode_cache import episode_attention
from rlvr.rollout.engines.hf.episode_decode import decode_episodes
from rlvr.rollout.engines.hf.forward import cpu_bf16_autocast, decode_mode, generation_mode, prefill
from rlvr.rollout.engines.hf.lean_decode import lean_decoder_for
from rlvr.rollout.engines.hf.shared_prefix import shared_prefix_attention, supports_shared_prefix
from rlvr.rollout.engines.hf.steps import LeanStep, TransformersStep, choose_layout, start_decode
from rlvr.rollout.engines.protocols import Generation, SamplingParams
from rlvr.rollout.engines.sampling import penalize_repetition, sample_tokens, seen_tokens
from rlvr.rollout.engines.turns import Trace, TurnDriver

AttentionInterface.register("rlvr_sdpa", sdpa_cache_dtype)
# transformers builds no attention mask at all for an attention name it has no mask function for:
# without this line the left padding of shorter prompts was attended to (found by
# tests/rollout/test_rollout.py::test_bf16_autocast_decode_respects_prompt_padding).
AttentionMaskInterface.register("rlvr_sdpa", sdpa_mask)
AttentionInterface.register("rlvr_prefix", shared_prefix_attention)
AttentionMaskInterface.register("rlvr_prefix", sdpa_mask)  # the prefill is plain masked SDPA
AttentionInterface.register("rlvr_episode", episode_attention)
AttentionMaskInterface.register("rlvr_episode", sdpa_mask)


class HFEngine:
    """Generation engine for transformers causal LMs (the model is shared with the trainer)."""

    def __init__(
        self,
        model,
        tokenizer,
        drop_finished_fraction: float = 0.25,
        static_cache: bool = True,
        shared_prefix: bool = True,
        lean: bool = True,
        merge_lora: bool = True,
        keep_merged: bool = False,
        compile_decode: bool = False,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.drop_finished_fraction = drop_finished_fraction
        self.static_cache = static_cache
        self.shared_prefix = shared_prefix  # decode reads each prompt's KV once per group (shared_prefix.py)
        self.lean = lean  # Llama-family models decode with lean_decode.py (static_cache only)
        # LoRA adapters generate merged into their base weights (rlvr.models.lora_merge); `keep_merged`: the merged
        # weights are kept between calls while no weight changes (a server), else freed after each (a trainer)
        self.merge_lora, self.keep_merged = merge_lora, keep_merged
        # the lean step's layers under torch.compile on the CPU (`rollout.compile`; compiled_decode.py), kept across calls
        self.compiled = CompiledLayers() if compile_decode else None

    def _mode(self, attention: str | None):
        return generation_mode(self.model, attention, merge_lora=self.merge_lora, keep_merged=self.keep_merged)

    def sync_weights(self) -> None:  # same module as the trainer's: nothing to copy
        pass

    @torch.no_grad()  # not inference_mode: the trainer's forward reuses these ids under autograd
    def generate(self, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int]) -> Generation:
        if len(seeds) != len(prompts):
            raise ValueError(f"need one seed per prompt, got {len(seeds)} for {len(prompts)} prompts")
        G, T = params.n, params.max_new_tokens
        layout = choose_layout(
            self.model, G, static=self.static_cache, shared_prefix=self.shared_prefix, lean=self.lean, compiled=self.compiled
        )
        with self._mode(layout.attention):
            pre = prefill(self.model, self.tokenizer, prompts, G)
            step = start_decode(self.model, pre, layout, G, T)
            gens = [torch.Generator(device=pre.prompt_ids.device).manual_seed(int(s)) for s in seeds]
            seen = seen_tokens(pre.prompt_ids, pre.prompt_mask, G, pre.logits.shape[-1]) if params.repetition_penalty != 1 else None
            next_pos = pre.prompt_mask.sum(-1).repeat_interleave(G, 0)
            completion, logprobs, entropies = self._decode(step, pre.logits, next_pos, params, gens, seen)
        return self._generation(pre.prompt_ids, pre.prompt_mask, completion, logprobs, entropies, params)

    @torch.no_grad()
    def generate_episodes(
        self, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int], driver: TurnDriver
    ) -> tuple[torch.Tensor, torch.Tensor, list[Trace]]:
        """MultiTurnEngine: episodes continue from their KV cache between turns (rlvr.rollout.engines.hf.episode_decode).
        Needs plain causal full attention (supports_shared_prefix)."""
        model = self.model
        if not supports_shared_prefix(model.config):
            raise ValueError(
                "multi-turn episodes with the hf engine need a model with plain full causal attention and "
                f"attn_implementation=sdpa (got {model.config._attn_implementation!r}, or sliding windows / soft-capping)"
            )
        # under bf16 autocast on the CPU fp32 buffers, or bf16 where this machine times that faster (episode_decode)
        cache_dtype, lower = (torch.float32, torch.bfloat16) if cpu_bf16_autocast(model) else (None, None)
        lean = lean_decoder_for(model) if self.lean else None  # read before the attention is swapped
        with self._mode("rlvr_episode"):
            return decode_episodes(model, self.tokenizer, prompts, params, seeds, driver, cache_dtype=cache_dtype, lower=lower, lean=lean)

    def _decode(self, step: TransformersStep | LeanStep, logits, next_pos, params: SamplingParams, gens, seen=None):
        """Sample up to T tokens per row: (completion ids, their log-probs, entropies or None), each [N, T].
        Finished rows keep their shape until a quarter of the rows still decoding have finished,
        then leave the batch together: a few compactions per decode, not one per token. `seen` [N, V] bool: the
        tokens each row holds so far, for the repetition penalty (None without one)."""
        N, T, G, device = logits.shape[0], params.max_new_tokens, params.n, logits.device
        completion = torch.full((N, T), self.tokenizer.pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((N, T), dtype=torch.float32, device=device)
        entropies = torch.zeros((N, T), dtype=torch.float32, device=device) if params.temperature > 0 else None
        finished = torch.zeros(N, dtype=torch.bool, device=device)
        active = torch.arange(N, device=device)  # rows still in the decode batch
        eos = self.tokenizer.eos_token_id
        with decode_mode():  # the outputs above stay normal tensors: training reads them
            for t in range(T):
                if seen is not None:
                    logits = penalize_repetition(logits.float(), seen[active], params.repetition_penalty)  # fp32 (a step's may be bf16)
                token, logp, entropy = self._sample(logits, params, gens, active, G)
                if seen is not None:
                    seen[active, token] = True
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
                    step.select(keep)
                    active, token, next_pos = active[keep], token[keep], next_pos[keep]
                logits = step.step(token, next_pos, active)
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
        u, p = uniforms[active], params  # the logits are this step's own, read by nothing after: sampled in place
        return sample_tokens(logits, u, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p, overwrite=True)
