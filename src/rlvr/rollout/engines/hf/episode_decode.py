"""Multi-turn decode for transformers models: episodes continue from their KV cache.

Each prompt is prefilled once; its G rows then decode with episode_cache.py, where every row
writes at its own position. A row's model turn ends at EOS or when its text ends with one of the
driver's stop strings (e.g. `</calc>`; rlvr.rollout.engines.turns, shared with the vllm engine);
the driver then either ends the episode or starts the tools (they run in the background) and the
row waits, out of the forward, while the others go on. Every step first asks the driver which
rows' tools have answered; only when no row can run does the loop block, until one has. When the
driver hands back the row's external tokens (tool results, template glue), they go in as one chunk
(one forward for all of them, beside the other rows' one-token step; loss mask 0, no log-prob), and
the row samples its next turn from the logits after the chunk's last token: a tool result of k tokens
costs one forward, not k decode steps. Nothing is ever re-tokenised or re-prefilled: the trained ids are the ids fed here.
Sampling noise comes from one generator per row, its k-th number taken by the row's k-th sample
(drawn up front), so a row's episode does not depend on when the other rows' tools finished.
Llama-family models run each step through lean_decode's step (no transformers per-token machinery), others through their forward.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache

from rlvr.models.kv_cache import cache_kwarg, dynamic_layer, prefilled_kv
from rlvr.models.machine_cache import machine_memory_bytes
from rlvr.rollout.engines.hf import episode_cache, kv_buffers
from rlvr.rollout.engines.hf.decode_attention import AttentionWay, decode_attention_way
from rlvr.rollout.engines.hf.episode_cache import EpisodeLayer, EpisodeState
from rlvr.rollout.engines.hf.forward import Prefill, decode_mode, padding_bias, prefill
from rlvr.rollout.engines.hf.lean_decode import LeanDecoder
from rlvr.rollout.engines.protocols import SamplingParams
from rlvr.rollout.engines.sampling import penalize_repetition, row_seed, sample_tokens, seen_tokens
from rlvr.rollout.engines.turns import (
    DONE,
    FORCE,
    SAMPLE,
    WAIT,
    StopMatcher,
    Trace,
    TurnDriver,
    eos_ids,
    resume_ready,
    take_external,
    take_sampled,
)


# On the CPU each row's KV buffers begin with its prompt's keys/values (the repeated layout), rather than the prompt's once
# per group: a tool result's chunk then attends over the rows that take it, where the shared layout's prompt part ran
# every row of their groups (the others' queries zero) for every token of the longest chunk. Whole batches of episodes
# took 0.46-0.74x the time on 26- and 272-token prompts, bf16 and fp32 (bench/results/episodes_layout_amd.md).
PROMPT_PER_ROW = True
# ...unless the prompt's copies in every row would take more than this share of the machine's memory (long prompts, many
# completions per prompt, a large model): then the prompt once per group
REPEATED_PROMPT_MEMORY_SHARE = 1 / 8


@torch.no_grad()
def decode_episodes(
    model,
    tokenizer,
    prompts: Sequence[str],
    params: SamplingParams,
    seeds: Sequence[int],
    driver: TurnDriver,
    *,
    cache_dtype: torch.dtype | None = None,
    lower: torch.dtype | None = None,
    lean: LeanDecoder | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[Trace]]:
    """(prompt_ids [B, P], prompt_mask [B, P], one Trace per row, prompt-major: B x params.n rows).
    params.max_new_tokens bounds each episode's tokens after the prompt (model and external).
    The KV buffers in cache_dtype (None: the prefill's), or in `lower` (bf16 under bf16 autocast on the CPU) where this
    machine timed the single-turn decode's attention in that layout faster so (decode_attention_way).
    `lean`: the decode steps run lean_decode's step on the same cache (Llama-family models), else the model's forward."""
    G, T, ckw = params.n, params.max_new_tokens, cache_kwarg(model)
    pre = prefill(model, tokenizer, prompts, G)
    way = _attention_way(model, pre, G, T, cache_dtype, lower)
    repeated, native = way is not None and not way.shared, way is not None and way.native
    cache, state = _episode_cache(pre, G, T, way.dtype if way else cache_dtype, repeated, native=repeated and native, lean=lean is not None)
    logits, device, N = pre.logits, pre.prompt_ids.device, pre.logits.shape[0]
    start = pre.prompt_mask.sum(-1).repeat_interleave(G)  # [N] position of each row's first token
    lengths = torch.zeros(N, dtype=torch.long, device=device)  # tokens each row has fed
    uniforms = _row_uniforms(seeds, G, T, device) if params.temperature > 0 else None  # [N, T]
    draws = torch.zeros(N, dtype=torch.long, device=device)  # samples each row has drawn
    traces = [Trace() for _ in range(N)]
    stop, eos = StopMatcher(tokenizer, driver.stop_strings), eos_ids(model, tokenizer)
    seen = seen_tokens(pre.prompt_ids, pre.prompt_mask, G, logits.shape[-1]) if params.repetition_penalty != 1 else None
    with decode_mode():  # what leaves the loop is Python (the traces' tokens and log-probs)
        while (runnable := _rows_to_run(traces, driver, T)) is not None:
            sampled = _sample(logits, [r for r in runnable if traces[r].mode == SAMPLE], params, uniforms, draws, seen)
            feed, chunks = _take_tokens(traces, runnable, sampled, T, driver=driver, stop=stop, eos=eos, ignore_eos=params.ignore_eos)
            _mark_fed(seen, feed, chunks)
            if chunks and feed and lean is not None and episode_cache.RAGGED and state.reads_own_slots():
                _feed_ragged(lean, state, [*feed, *chunks], logits, start, lengths)
                continue
            if chunks:
                _feed_chunks(model, lean, state, chunks, logits, start, lengths, pad=tokenizer.pad_token_id or 0, cache={ckw: cache})
            if feed:
                _feed_tokens(model, lean, state, feed, logits, start, lengths, cache={ckw: cache})
    return pre.prompt_ids, pre.prompt_mask, traces


def _feed_tokens(model, lean: LeanDecoder | None, state: EpisodeState, feed: list, logits, start, lengths, *, cache) -> None:
    """One forward of a sampled token for each row of `feed` [(row, token)]: logits [N, V] get each row's next, lengths
    [N] one more."""
    device = logits.device
    rows = torch.tensor([r for r, _ in feed], device=device)
    tokens = torch.tensor([t for _, t in feed], device=device)
    state.prepare(rows, lengths, lengths.shape[0])
    positions = start[rows] + lengths[rows]
    if lean is not None:
        logits[rows] = lean.step_episode(tokens, positions, state)
    else:
        out = model(input_ids=tokens[:, None], position_ids=positions[:, None], use_cache=True, rlvr_episode=state, **cache)
        logits[rows] = out.logits[:, -1].float()
    lengths[rows] += 1


def _mark_fed(seen: torch.Tensor | None, feed: list[tuple[int, int]], chunks: list[tuple[int, list[int]]]) -> None:
    """The repetition penalty's tokens so far (seen [N, V], None without one): each row's prompt, then every token it
    feeds, sampled or external (a tool's result), as transformers' processor reads a whole episode's ids."""
    if seen is not None:
        for r, ids in [*((r, [t]) for r, t in feed), *chunks]:
            seen[r, ids] = True


def _take_tokens(traces: list[Trace], runnable: list[int], sampled: dict, T: int, **take) -> tuple[list, list]:
    """Each runnable row takes its sampled token, or all the external tokens waiting for it (one forward for them):
    -> ((row, token) that go into the cache this step, (row, tokens) of external chunks); rows done go in neither."""
    feed, chunks = [], []
    for r in runnable:
        tr = traces[r]
        if tr.mode == FORCE:
            taken = take_external(tr, T)
        else:
            token, logp = sampled[r]
            taken = [token]
            take_sampled(tr, r, taken, [logp], budget=T, **take)
        if tr.mode == DONE:
            continue
        if len(taken) == 1:
            feed.append((r, taken[0]))
        else:
            chunks.append((r, taken))
    return feed, chunks


def _feed_chunks(
    model, lean: LeanDecoder | None, state: EpisodeState, chunks: list[tuple[int, list[int]]], logits, start, lengths, *, pad: int, cache
) -> None:
    """One forward for the rows taking several external tokens (a tool's result): each row's chunk right-padded to
    the longest, causal within it; logits [N, V] get each row's after its last real token, lengths [N] its count.
    The lean step computes only those logits; the model's forward computes them for every token of the chunk."""
    device = logits.device
    rows = torch.tensor([r for r, _ in chunks], device=device)  # [m]
    counts = torch.tensor([len(t) for _, t in chunks], device=device)  # [m]
    K = int(counts.max())
    tokens = torch.full((len(chunks), K), pad, dtype=torch.long, device=device)  # [m, K]
    for i, (_, ids) in enumerate(chunks):
        tokens[i, : len(ids)] = torch.tensor(ids, device=device)
    state.prepare(rows, lengths, lengths.shape[0], counts)
    positions = (start[rows] + lengths[rows])[:, None] + torch.arange(K, device=device)  # [m, K]
    if lean is not None:
        logits[rows] = lean.step_episode(tokens, positions, state, last=counts - 1)
    else:
        out = model(input_ids=tokens, position_ids=positions, use_cache=True, rlvr_episode=state, **cache)
        logits[rows] = out.logits[torch.arange(len(chunks), device=device), counts - 1].float()
    lengths[rows] += counts


def _feed_ragged(lean: LeanDecoder, state: EpisodeState, runs: list, logits, start, lengths) -> None:
    """One forward for a step's sampled tokens and tool results together: runs [(row, token) or (row, tokens)], each
    row's tokens side by side with the others', none padded, each read to its own slot (EpisodeState.prepare_ragged);
    logits [N, V] get each row's after its last token, lengths [N] its count."""
    device = logits.device
    ids = [list(t) if isinstance(t, list) else [t] for _, t in runs]
    rows = torch.tensor([r for r, _ in runs], device=device)  # [n]
    counts = torch.tensor([len(t) for t in ids], device=device)  # [n]
    tokens = torch.tensor([t for run in ids for t in run], device=device)  # [M]
    steps = state.prepare_ragged(rows, lengths, counts)
    assert state.query_rows is not None
    positions = start[state.query_rows] + lengths[state.query_rows] + steps  # [M]
    logits[rows] = lean.step_episode(tokens, positions, state, keep=torch.cumsum(counts, 0) - 1)
    lengths[rows] += counts


def _episode_cache(
    pre: Prefill, G: int, T: int, cache_dtype: torch.dtype | None, repeated: bool, native: bool = False, lean: bool = False
) -> tuple[DynamicCache, EpisodeState]:
    """The prefill's cache, each prompt's keys/values then shared by its G rows (or, `repeated`, copied to the head of
    each row's buffers), each row writing at its own position; `native`: one-token steps attend through the C kernel
    (and with `lean`, lean_decode's step, every forward: episode_cache.native_step)."""
    cache, N = pre.cache, pre.prompt_ids.shape[0] * G
    kv_dtype = cache_dtype or prefilled_kv(cache.layers[0])[0].dtype
    # the scores (and so the masks) in fp32 or wider: with bf16 buffers only the products run in bf16 (decode_attention.py)
    bias = padding_bias(pre.prompt_mask, torch.promote_types(kv_dtype, torch.float32))
    state = EpisodeState(cache, G, bias, prompt_slots=pre.prompt_ids.shape[1] if repeated else 0, native=native, lean=lean)
    for i, layer in enumerate(cache.layers):
        cache.layers[i] = EpisodeLayer(dynamic_layer(layer), state, N, T, cache_dtype)
    return cache, state


def _attention_way(model, pre: Prefill, G: int, T: int, dtype: torch.dtype | None, lower: torch.dtype | None) -> AttentionWay | None:
    """On the CPU (PROMPT_PER_ROW) the repeated layout, its buffers in `dtype` or, under bf16 autocast (`lower`), in
    bf16 where this machine timed the single-turn decode's attention of that layout at these shapes at most
    LOWER_AT_MOST of fp32's time (decode_attention_way). None elsewhere, and where the prompt's copies would not fit
    in REPEATED_PROMPT_MEMORY_SHARE of the memory: the shared layout in `dtype`."""
    k = prefilled_kv(pre.cache.layers[0])[0]
    if k.device.type != "cpu" or not PROMPT_PER_ROW:
        return None
    B, Hkv, P, D = k.shape
    heads, layers = model.config.num_attention_heads, len(pre.cache.layers)
    copies = B * G * Hkv * P * D * 2 * layers * (dtype or k.dtype).itemsize  # keys and values
    if copies > REPEATED_PROMPT_MEMORY_SHARE * machine_memory_bytes():
        return None
    # the episode attention runs the explicit products, or a one-token step's through the C kernel (native): the flash
    # kernel is not timed for it
    way_dtype = dtype or k.dtype
    return decode_attention_way(
        B, G, heads, Hkv, D, P, T, way_dtype, shared=False, lower=lower, layers=layers, repeated_flash=False, native=kv_buffers.GROW > 0
    )


def _rows_to_run(traces: list[Trace], driver: TurnDriver, T: int) -> list[int] | None:
    """The rows that feed a token this step, after resuming those whose tools have answered (waiting
    for them when no other row can run; [] when none has answered yet); None once every episode is done."""
    resume_ready(traces, driver, T)
    runnable = [r for r, tr in enumerate(traces) if tr.mode in (SAMPLE, FORCE)]
    if not runnable and not any(tr.mode == WAIT for tr in traces):
        return None
    return runnable


def _row_uniforms(seeds: Sequence[int], G: int, T: int, device: torch.device) -> torch.Tensor:
    """[B x G, T]: row r's random numbers for its samples in order, from its own generator (seeded by row_seed), drawn
    up front: a row samples at most T times (its episode's budget). On the CPU one draw of T numbers gives the numbers
    T draws of one give (tested); elsewhere they may be other numbers, still the row's own. A row's samples depend only
    on its seed and how often it sampled, with no generator call per row and step (64 rows, 103-token vocabulary,
    Intel Xeon: the sampling 0.12 ms a step instead of 0.21)."""
    gens = [torch.Generator(device=device).manual_seed(row_seed(seeds[r // G], r % G)) for r in range(len(seeds) * G)]
    return torch.stack([torch.rand(T, generator=g, device=device) for g in gens])


def _sample(
    logits: torch.Tensor,
    rows: list[int],
    params: SamplingParams,
    uniforms: torch.Tensor | None,
    draws: torch.Tensor,
    seen: torch.Tensor | None = None,
) -> dict[int, tuple[int, float]]:
    """(token, its log-prob) for each of `rows`, from their logits (logits [N, V]), together; each row takes its next
    random number (uniforms [N, T]; draws [N]: how many each row took before; inverse-CDF:
    rlvr.rollout.engines.sampling.sample_tokens). `seen` [N, V]: each row's tokens so far, for the repetition penalty."""
    if not rows:
        return {}
    x = logits[rows]  # [n, V]
    if seen is not None:
        x = penalize_repetition(x, seen[rows], params.repetition_penalty)
    if uniforms is None:  # temperature 0: greedy
        return {r: (t, 0.0) for r, t in zip(rows, x.argmax(-1).tolist())}
    index = torch.tensor(rows, device=x.device)
    u = uniforms[index, draws[index]]  # [n]
    draws[index] += 1
    token, logp, _ = sample_tokens(  # x is a copy of the rows' logits: sampled in place
        x, u, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p, entropy=False, overwrite=True
    )
    return dict(zip(rows, zip(token.tolist(), logp.tolist())))
