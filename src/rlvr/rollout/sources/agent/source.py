"""AgentSource: a user's agent as a rollout source (`rollout.agent: file.py:fn`).

    def fn(row, base_url, model, api_key) -> float | None      # or `async def`

runs one episode with any client (the `openai` package, an agent framework, raw HTTP) against the
policy, served at `base_url` (this episode's own: its calls are grouped without the agent's help)
by the OpenAI-compatible endpoint (endpoint.py). It returns the episode's reward, or None to let
`rewards` score the episode's final messages. G episodes per row, each with its own seed.

An agent that raises, returns something else, or runs past `rollout.agent_timeout` gets no reward
and no gradient (counted, its first error shown); an episode that never called the endpoint is
reported and not trained on; an episode whose calls do not continue each other (the agent rewrote
its history: EpisodeLog.sequences() has several) is counted in `agent/split_episodes`; its first
sequence is its row (what rewards score), the others are trained beside it with its advantage
(Episodes.extra_sequences), never merged. When every episode of a step fails, the run stops
with the first error.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from rlvr.data import render_prompt
from rlvr.rollout.engines.protocols import SamplingParams
from rlvr.rollout.engines.sampling import row_seed
from rlvr.rollout.episodes import Episodes, pad_rows
from rlvr.rollout.sources.agent.batcher import Scheduler
from rlvr.rollout.sources.agent.calls import EpisodeLog, TrainingSequence
from rlvr.rollout.sources.agent.endpoint import AgentEndpoint
from rlvr.rollout.sources.agent.tags import TagSettings


class AgentFailed(ValueError):
    """Every episode of a step failed in the agent."""


@dataclass
class _Outcome:
    reward: float | None = None
    error: str | None = None  # why the episode gets no reward and no gradient
    timed_out: bool = False


@dataclass
class AgentStats:
    episodes: int = 0
    errors: int = 0  # raised or returned a wrong type
    timeouts: int = 0
    no_calls: int = 0  # never called the endpoint
    split: int = 0  # calls that do not continue each other
    first_error: str | None = None


class AgentSource:
    """RolloutSource over a user's agent; `sampler`: how the endpoint samples (batcher.Sampler), or `decoder`: makes the
    scheduler each batch's endpoint hands its requests to (the hf engine's continuous decoder)."""

    reward_columns: frozenset[str] = frozenset()  # reward functions get the dataset's columns only

    def __init__(self, fn: Callable, engine, tokenizer, sampling: SamplingParams, *, sampler, timeout: float, context_length: int | None,
                 system_prompt: str | None = None, model_name: str = "rlvr-policy", tags: TagSettings | None = None,
                 decoder: Callable[[], Scheduler] | None = None):  # fmt: skip
        self.fn, self.engine, self.tokenizer, self.sampling, self.sampler = fn, engine, tokenizer, sampling, sampler
        self.timeout, self.context_length, self.system_prompt, self.model_name = timeout, context_length, system_prompt, model_name
        self.tags = tags  # the model's tag protocol, for an endpoint that parses tool calls from tags
        self.decoder = decoder
        self.is_async = inspect.iscoroutinefunction(fn)
        self.endpoint: AgentEndpoint | None = None
        self.stats = AgentStats()
        self.last_logs: list[EpisodeLog] = []  # the last batch's episodes, call by call (tests, debugging)

    @property
    def group_size(self) -> int:
        return self.sampling.n

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    @property
    def first_env_error(self) -> str | None:
        """The last batch's first agent error (held-out evaluation reports it, as it does an environment's)."""
        return self.stats.first_error

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None

    def _endpoint(self) -> AgentEndpoint:
        if self.endpoint is None:
            self.endpoint = AgentEndpoint(
                self.sampler, self.tokenizer, model_name=self.model_name, max_tokens=self.sampling.max_new_tokens,
                context_length=self.context_length, tags=self.tags, scheduler=self.decoder() if self.decoder else None,
                driven=True,  # the requests are sampled on the thread that runs the agents (_run_agents)
            )  # fmt: skip
        return self.endpoint

    # ---------------------------------------------------------------- one batch

    def rollout(self, rows: list[dict], seeds: list[int]) -> Episodes:
        ep, G = self._endpoint(), self.group_size
        logs = [ep.open_episode(row_seed(seeds[i], g)) for i in range(len(rows)) for g in range(G)]
        try:
            outcomes = self._run_agents([rows[i // G] for i in range(len(logs))], [ep.base_url(log.episode) for log in logs], ep)
        finally:
            for log in logs:
                ep.close_episode(log.episode)
            self.close()  # one endpoint per batch: nothing outlives it (an agent still running is refused from now on)
        self.stats, self.last_logs = (stats := AgentStats(episodes=len(logs))), logs
        for o in outcomes:
            stats.errors += o.error is not None and not o.timed_out
            stats.timeouts += o.timed_out
            stats.first_error = stats.first_error or o.error
        if stats.errors + stats.timeouts == len(logs):
            raise AgentFailed(f"rollout.agent failed on every episode of the step; the first: {stats.first_error}")
        return self._episodes(rows, logs, outcomes)

    def _run_agents(self, rows: list[dict], urls: list[str], ep: AgentEndpoint) -> list[_Outcome]:
        """Every episode's agent at once, each in its own thread; those not done after the timeout are abandoned."""
        outcomes = [_Outcome() for _ in urls]
        threads = [
            threading.Thread(target=self._one, args=(dict(row), url, ep.api_key, out), daemon=True, name="rlvr-agent")
            for row, url, out in zip(rows, urls, outcomes)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + self.timeout
        # this thread samples their requests meanwhile, until all are done or out of time
        ep.batcher.drive(lambda: time.monotonic() >= deadline or not any(t.is_alive() for t in threads))
        for t, out in zip(threads, outcomes):
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                out.reward, out.timed_out = None, True
                out.error = f"the agent ran past rollout.agent_timeout={self.timeout:g}s"
        return outcomes

    def _one(self, row: dict, url: str, key: str, out: _Outcome) -> None:
        try:
            result = self.fn(row, url, self.model_name, key)
            if self.is_async or inspect.iscoroutine(result):
                result = asyncio.run(result)
        except Exception as e:  # the episode fails, the run goes on
            out.error = f"{type(e).__name__}: {e}"
            return
        if result is not None and (isinstance(result, bool) or not isinstance(result, (int, float))):
            out.error = f"the agent returned {type(result).__name__} {result!r:.80}: it must return a float reward or None"
            return
        out.reward = None if result is None else float(result)

    # ---------------------------------------------------------------- episodes

    def _episodes(self, rows: list[dict], logs: list[EpisodeLog], outcomes: list[_Outcome]) -> Episodes:
        """One row per episode (its first training sequence, what rewards score); an episode whose calls make several
        sequences (a rewritten history) has the rest as extra sequences, trained with its advantage."""
        G = self.group_size
        firsts: list[TrainingSequence] = []
        extras: list[TrainingSequence] = []
        of, valid, info = [], [], _Info()
        for i, (log, out) in enumerate(zip(logs, outcomes)):
            seqs = log.sequences()
            info.add(log.summary())
            self.stats.no_calls += not seqs
            self.stats.split += len(seqs) > 1
            ok = out.error is None and bool(seqs)  # a failed episode, or one that never called: nothing to train
            valid.append(ok)
            seqs = [_untrained(s) for s in seqs] if not ok else seqs
            firsts.append(seqs[0] if seqs else self._unsampled(rows[i // G]))
            extras += seqs[1:]
            of += [i] * len(seqs[1:])
        reward = torch.tensor([float("nan") if o.reward is None else o.reward for o in outcomes])
        episodes = self._rows(firsts, [_final_messages(log) for log in logs], torch.arange(len(rows)).repeat_interleave(G))
        episodes.info, episodes.extra_rewards, episodes.valid = info.tensors(), {"agent": reward}, torch.tensor(valid)
        episodes.logged = {"agent_calls": [_calls_for_log(log) for log in logs]}  # the run log's samples: each call in order
        if extras:  # NaN reward: the agent left it to `rewards`
            episodes.extra_sequences, episodes.extra_sequence_of = self._rows(extras, None, torch.arange(len(extras))), torch.tensor(of)
        return episodes

    def _unsampled(self, row: dict) -> TrainingSequence:
        """An episode that never called the endpoint: the row's own prompt, nothing sampled."""
        ids = self.tokenizer(render_prompt(row["prompt"], self.tokenizer, self.system_prompt), add_special_tokens=False)["input_ids"]
        return TrainingSequence(list(ids), [0] * len(ids), [0.0] * len(ids), len(ids))

    def _rows(self, seqs: list[TrainingSequence], completions: list | None, group_ids: torch.Tensor) -> Episodes:
        """Sequences as Episodes rows: the prompt (before the first sampled token) left-padded, the rest right-padded;
        `completions`: what rewards see (None: the decoded text, for sequences never scored)."""
        pad, P = self.tokenizer.pad_token_id, [s.prompt_length for s in seqs]
        p_ids, p_mask = pad_rows([s.ids[:p] for s, p in zip(seqs, P)], pad, left=True)
        ids, attn = pad_rows([s.ids[p:] for s, p in zip(seqs, P)], pad, min_width=1)
        loss, _ = pad_rows([s.mask[p:] for s, p in zip(seqs, P)], 0, min_width=1)
        logp, _ = pad_rows([s.logprobs[p:] for s, p in zip(seqs, P)], 0.0, min_width=1, dtype=torch.float32)
        texts = self.tokenizer.batch_decode(ids.masked_fill(attn == 0, pad), skip_special_tokens=True)
        return Episodes(p_ids, p_mask, ids, attn, loss, logp, torch.zeros(len(seqs), dtype=torch.bool), group_ids, self.group_size,
                        texts if completions is None else completions, texts)  # fmt: skip

    def metrics(self, episodes: Episodes) -> dict[str, float]:
        s = self.stats
        out = {
            f"agent/{k}_per_episode": float(v.float().mean())
            for k, v in episodes.info.items()
            if k in ("calls", "sampled_tokens", "tool_calls")
        }
        n = max(1, s.episodes)
        out.update({"agent/error_frequency": s.errors / n, "agent/timeout_frequency": s.timeouts / n})
        out.update({"agent/split_episodes": float(s.split), "agent/no_call_episodes": float(s.no_calls)})
        return out


class _Info:
    def __init__(self):
        self.values: dict[str, list[float]] = {}

    def add(self, summary: dict[str, int]) -> None:
        for k in ("calls", "sampled_tokens", "tool_calls"):
            self.values.setdefault(k, []).append(float(summary[k]))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: torch.tensor(v) for k, v in self.values.items()}


def _calls_for_log(log: EpisodeLog) -> list[dict[str, Any]]:
    """Each call of the episode in order: what the agent sent since the previous call (all of it when the call does
    not continue that one), the reply, token counts, how it ended, and the training sequence it joined."""
    where = {c: j for j, seq in enumerate(log.sequences()) for c in seq.calls}
    out, before = [], None
    for call in log.snapshot():
        if call.messages is not None:
            seen = 0 if before is None or before.messages is None else len(before.messages) + 1
            fits = before is not None and before.messages is not None and call.messages[: seen - 1] == before.messages
            sent: Any = call.messages[seen:] if fits else call.messages
            reply: Any = call.reply
        else:
            done: str | None = None if before is None or before.prompt_text is None else before.prompt_text + before.full_text
            text = call.prompt_text or ""
            sent, reply = (text[len(done) :] if done is not None and text.startswith(done) else text), call.text
        out.append({"call": call.index, "sent": sent, "reply": reply, "prompt_tokens": len(call.prompt_ids),
                    "sampled_tokens": len(call.sampled_ids), "finish": call.finish, "sequence": where.get(call.index, 0)})  # fmt: skip
        before = call
    return out


def _untrained(s: TrainingSequence) -> TrainingSequence:
    return TrainingSequence(s.ids, [0] * len(s.mask), s.logprobs, s.prompt_length, s.calls)


def _final_messages(log: EpisodeLog) -> list[dict[str, Any]]:
    """What reward functions see (TRL's conversational shape): the last chat call's messages after those of the
    first call (the agent's prompt), then its reply; a completion call's text as one assistant message."""
    calls = log.snapshot()
    if not calls:
        return [{"role": "assistant", "content": ""}]
    last = calls[-1]
    if last.messages is None:
        return [{"role": "assistant", "content": last.text}]
    start = len(calls[0].messages or [])
    return [*last.messages[start:], last.reply or {"role": "assistant", "content": last.text}]
