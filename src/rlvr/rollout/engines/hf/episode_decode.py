"""Multi-turn decode for transformers models: episodes continue from their KV cache.

Each prompt is prefilled once; its G rows then decode with rlvr.rollout.engines.hf.episode_cache, where
every row writes at its own position. A row's model turn ends at EOS or when its text ends with
one of the driver's stop strings (e.g. `</calc>`); the driver then either ends the episode or
starts the tools (they run in the background) and the row waits, out of the forward, while the
others go on. Every step first asks the driver which rows' tools have answered; only when no row
can run does the loop block, until one has. When the driver hands back the row's external tokens
(tool results, template glue), they are fed one per step, as sampled tokens are, but with loss
mask 0 and no log-prob, and the row then samples its next turn. Nothing is ever re-tokenised or re-prefilled: the trained ids are the ids fed here.
Sampling noise comes from one generator per row, drawn only when that row samples, so a row's
episode does not depend on when the other rows' tools finished.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache

from rlvr.models.kv_cache import cache_kwarg
from rlvr.rollout.engines.hf.episode_cache import EpisodeLayer, EpisodeState
from rlvr.rollout.engines.protocols import SamplingParams, sample_tokens
from rlvr.rollout.engines.turns import DONE, FORCE, SAMPLE, WAIT, StopMatcher, Trace, TurnDriver, eos_ids, resume

@torch.no_grad()
def decode_episodes(model, tokenizer, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int], driver: TurnDriver,
                    *, cache_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, list[Trace]]:
    """(prompt_ids [B, P], prompt_mask [B, P], one Trace per row, prompt-major: B x params.n rows).
    params.max_new_tokens bounds each episode's tokens after the prompt (model and external)."""
    G, T, ckw = params.n, params.max_new_tokens, cache_kwarg(model)
    prompt_ids, prompt_mask, logits, cache, state = _prefill(model, tokenizer, prompts, G, T, ckw, cache_dtype)
    device, N = prompt_ids.device, logits.shape[0]
    start = prompt_mask.sum(-1).repeat_interleave(G)  # [N] position of each row's first token
    lengths = torch.zeros(N, dtype=torch.long, device=device)  # tokens each row has fed
    gens = [torch.Generator(device=device).manual_seed((int(seeds[r // G]) * 9973 + r % G) % 2**63) for r in range(N)]
    traces = [Trace() for _ in range(N)]
    stop, eos = StopMatcher(tokenizer, driver.stop_strings), eos_ids(model, tokenizer)
    while (runnable := _rows_to_run(traces, driver, T)) is not None:
        sampled = _sample(logits, [r for r in runnable if traces[r].mode == SAMPLE], params, gens)
        feed = []  # (row, token) that go into the cache this step
        for r in runnable:
            tr = traces[r]
            token, forced = _take_token(tr, sampled.get(r))
            if not forced:
                _end_turn_at_stop(tr, r, token, driver, stop, eos, ignore_eos=params.ignore_eos)
            if len(tr.ids) >= T and tr.mode != DONE:
                tr.truncated, tr.mode = True, DONE
            if tr.mode != DONE:
                feed.append((r, token))
        if feed:
            rows = torch.tensor([r for r, _ in feed], device=device)
            tokens = torch.tensor([t for _, t in feed], device=device)
            state.prepare(rows, lengths, N)
            out = model(input_ids=tokens[:, None], position_ids=(start[rows] + lengths[rows])[:, None], use_cache=True,
                        rlvr_episode=state, **{ckw: cache})
            logits[rows] = out.logits[:, -1].float()
            lengths[rows] += 1
    return prompt_ids, prompt_mask, traces


def _prefill(model, tokenizer, prompts: Sequence[str], G: int, T: int, ckw: str, cache_dtype: torch.dtype | None):
    """Each prompt once, its cache then shared by its G rows, each row writing at its own position:
    (prompt_ids [B, P], prompt_mask [B, P], each row's next-token logits [N, V], the cache, its EpisodeState)."""
    device = next(model.parameters()).device
    enc = tokenizer(list(prompts), padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
    prompt_ids, prompt_mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)  # [B, P]
    B, N = prompt_ids.shape[0], prompt_ids.shape[0] * G
    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
                use_cache=True, logits_to_keep=1, **{ckw: cache})
    logits = out.logits[:, -1].float().repeat_interleave(G, 0)  # [N, V]
    kdtype = cache_dtype or cache.layers[0].keys.dtype
    bias = torch.zeros(B, 1, 1, prompt_ids.shape[1], dtype=kdtype, device=device).masked_fill(
        prompt_mask[:, None, None, :] == 0, torch.finfo(kdtype).min)
    state = EpisodeState(cache, G, bias)
    for i, layer in enumerate(cache.layers):
        cache.layers[i] = EpisodeLayer(layer, state, N, T, cache_dtype)
    return prompt_ids, prompt_mask, logits, cache, state


def _rows_to_run(traces: list[Trace], driver: TurnDriver, T: int) -> list[int] | None:
    """The rows that feed a token this step, after resuming those whose tools have answered (waiting
    for them when no other row can run; [] when none has answered yet); None once every episode is done."""
    waiting = [r for r, tr in enumerate(traces) if tr.mode == WAIT]
    runnable = [r for r, tr in enumerate(traces) if tr.mode in (SAMPLE, FORCE)]
    for r, ext in driver.ready(block=not runnable and bool(waiting)).items():
        resume(traces[r], ext, T)
    runnable = [r for r, tr in enumerate(traces) if tr.mode in (SAMPLE, FORCE)]
    if not runnable and not any(tr.mode == WAIT for tr in traces):
        return None
    return runnable


def _take_token(tr: Trace, sample: tuple[int, float] | None) -> tuple[int, bool]:
    """The row's next token, appended to its trace: its next external token (loss mask 0, no
    log-prob) or its `sample` (token, log-prob). -> (token, whether it was external)."""
    forced = tr.mode == FORCE
    if forced:
        token, logp = tr.forced.popleft(), 0.0
        if not tr.forced:
            tr.mode = SAMPLE
    else:
        token, logp = sample
    tr.ids.append(token)
    tr.loss.append(0 if forced else 1)
    tr.logps.append(logp)
    return token, forced


def _end_turn_at_stop(tr: Trace, r: int, token: int, driver: TurnDriver, stop: StopMatcher, eos, *, ignore_eos: bool) -> None:
    """A sampled token joins the row's turn; at EOS or a stop string the driver takes the turn and
    the row waits for its tools, or its episode is done."""
    tr.turn.append(token)
    ended_eos = token in eos and not ignore_eos
    if ended_eos or stop(tr.turn):
        turn, tr.turn = tr.turn, []
        tr.mode = WAIT if driver.end_turn(r, turn, ended_eos) else DONE


def _sample(logits: torch.Tensor, rows: list[int], params: SamplingParams, gens: list[torch.Generator]) -> dict[int, tuple[int, float]]:
    """(token, its log-prob) for each of `rows`, from their logits (logits [N, V]), together; each
    row's random number comes from its own generator, drawn only when it samples (inverse-CDF:
    rlvr.rollout.engines.protocols.sample_tokens)."""
    if not rows:
        return {}
    x = logits[rows]  # [n, V]
    if params.temperature == 0:
        return {r: (t, 0.0) for r, t in zip(rows, x.argmax(-1).tolist())}
    uniforms = torch.cat([torch.rand(1, generator=gens[r], device=x.device) for r in rows])  # [n]
    token, logp, _ = sample_tokens(x, uniforms, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
    return dict(zip(rows, zip(token.tolist(), logp.tolist())))
