"""Continuous batching for requests that arrive while others decode (an outside agent's calls, rollout.agent).

Requests join the decode at the next token and leave it when done; nothing waits for a batch to
finish. A request whose prompt continues a sequence the decoder already holds (an agent's next call:
the same history, its reply, then new messages) feeds only its new tokens to that sequence's cache;
the history is never prefilled again.

  rows       one per sequence: its keys/values in buffers [R, Hkv, capacity, D] per layer (RowLayer),
             grown by doubling; a finished row stays, idle, for its episode's next call
  a step     rows with tokens to feed (a new prompt, or what a call adds to its row) run them as one
             chunk each (rows with chunks of one length together); then every sampling row draws its
             token and those still going feed it, one batched forward of one token per row
  sampling   a request's own settings (temperature, top_p) and its own generator, seeded by the
             request, drawing n numbers per step as HFEngine does: a reply does not depend on which
             other requests share the steps
  ends       EOS, one of the request's stop strings (the token that completes it is kept), or its max_tokens

Attention (`rlvr_rows`): each new token against its row's own written slots (scaled_dot_product_attention
with a per-row mask), so rows of any lengths share a forward. Needs plain causal full attention.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch
from transformers import DynamicCache

from rlvr.models.kv_cache import cache_kwarg
from rlvr.rollout.engines.hf.forward import decode_mode, generation_mode
from rlvr.rollout.engines.hf.row_cache import RowLayer, RowsState
from rlvr.rollout.engines.remote.protocol import Sample
from rlvr.rollout.engines.sampling import sample_tokens
from rlvr.rollout.engines.turns import StopMatcher


class DecodeRequest(Protocol):
    """What a request to the decoder holds (rlvr.rollout.sources.agent.batcher.Job is one)."""

    prompt_ids: list[int]
    max_tokens: int
    seed: int
    n: int
    temperature: float
    top_p: float
    stops: tuple[str, ...]
    episode: str  # rows are reused only within an episode


# ---------------------------------------------------------------- rows and requests


@dataclass
class _Asked:
    """A request being answered: its rows' samples, the generator its rows draw from."""

    req: DecodeRequest
    gen: torch.Generator
    stop: StopMatcher
    samples: list[Sample | None]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass
class _Row:
    episode: str
    fed: list[int] = field(default_factory=list)  # ids whose keys/values are in the row's cache
    pending: list[int] = field(default_factory=list)  # ids to feed before it samples
    logits: torch.Tensor | None = None  # [V] fp32: the next-token logits after `fed`
    asked: _Asked | None = None  # None: idle (kept for its episode's next call)
    choice: int = 0
    sampled: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)


# ---------------------------------------------------------------- the decoder


class ContinuousDecoder:
    """submit(request) -> its n samples, from any thread; one thread decodes every request: the decoder's own (held in
    generation mode from start to close(): create it for a collection and close it before the update), or, made with
    own_thread=False, the caller's inside drive() (the trainer's main thread, 1.4x faster on CPU:
    bench/results/agent_decode_main_thread.md)."""

    def __init__(
        self, model, tokenizer, *, eos: set[int], cache_dtype: torch.dtype | None = None, merge_lora: bool = True, own_thread: bool = True
    ):
        """`own_thread=False`: no decode thread; the caller decodes on its own thread with drive() (the trainer's main
        thread: on a GPU, model work from any other thread ran up to 8x slower, bench/results/gpu_server_overhead.md)."""
        self.model, self.tokenizer, self.eos, self.ckw = model, tokenizer, eos, cache_kwarg(model)
        self.merge_lora = merge_lora  # as the hf engine it decodes for (model.lora.merge_for_generation)
        self.device = next(model.parameters()).device
        self.state = RowsState()
        self.cache = DynamicCache(config=model.config)
        for i in range(len(self.cache.layers)):
            self.cache.layers[i] = RowLayer(self.state, cache_dtype)
        self.rows: list[_Row | None] = []
        self.queue: list[_Asked] = []
        self.cond = threading.Condition()
        self.closed = False
        self.forwards = 0  # model forwards run
        self.tokens_fed = 0  # tokens run through the model (an agent's history is not run again)
        self.failure: BaseException | None = None  # what ended the decode thread, when something did
        self.thread: threading.Thread | None = None
        if not own_thread:
            return
        self.thread = threading.Thread(target=self._run, name="rlvr-continuous-decode", daemon=True)
        self.in_mode = threading.Event()  # the thread holds the model in generation mode
        self.thread.start()
        # back only once the thread's generation mode is on: a region the caller opens after this nests inside it
        # and gives it back its attention at exit (one opened before would restore the model's own under the thread)
        self.in_mode.wait()
        if self.failure is not None:  # generation mode did not start: no decoder to hand out
            self.thread.join()
            raise self.failure

    def submit(self, req: DecodeRequest) -> list[Sample]:
        gen = torch.Generator(device=self.device).manual_seed(int(req.seed))
        asked = _Asked(req, gen, StopMatcher(self.tokenizer, req.stops), [None] * req.n)
        with self.cond:
            if self.closed:
                raise RuntimeError("the decoder is closed") from self.failure
            self.queue.append(asked)
            self.cond.notify_all()
        asked.done.wait()
        if asked.error is not None:
            raise asked.error
        return [s for s in asked.samples if s is not None]

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join()
        else:  # driven: whatever arrived after the last drive() is answered now, not waited on forever
            self._fail_all(RuntimeError("the decoder closed before this request was answered"))

    def drive(self, until: Callable[[], bool]) -> None:
        """Decode on this thread until `until()` holds: checked before every step, so it must hold only when nothing is
        left worth decoding (every caller done, or their time is up). A decoder with its own thread: just wait."""
        if self.thread is not None:
            while not until():
                time.sleep(0.02)
            return
        with torch.no_grad(), generation_mode(self.model, "rlvr_rows", merge_lora=self.merge_lora), decode_mode():
            self._decode(until)

    # ------------------------------------------------------------ the loop

    def _decode(self, until: Callable[[], bool] | None) -> None:
        while self._admit(until):
            try:
                self._feed_chunks()
                self._step()
            except Exception as e:  # every request in the decode answers the error; the decoder goes on
                self._fail_all(e)

    def _run(self) -> None:
        try:
            with torch.no_grad(), generation_mode(self.model, "rlvr_rows", merge_lora=self.merge_lora), decode_mode():
                self.in_mode.set()
                self._decode(None)
        except BaseException as e:  # generation mode failed to start or to end: the thread ends here, with the reason
            self.failure = e
        finally:
            with self.cond:
                self.closed = True  # a later submit raises at once instead of waiting on a thread that is gone
            self.in_mode.set()  # also when generation mode failed to start: __init__ must not wait forever
        self._fail_all(self.failure or RuntimeError("the decoder closed before this request was answered"))

    def _admit(self, until: Callable[[], bool] | None) -> bool:
        """Rows for the requests that arrived (waiting for one when nothing decodes); False once closed or `until()`."""
        with self.cond:
            while True:
                if self.closed or (until is not None and until()):
                    return False
                if self.queue or any(r is not None and r.asked is not None for r in self.rows):
                    break
                self.cond.wait(None if until is None else 0.02)  # driven: `until` may turn true without a notify
            new, self.queue = self.queue, []
        for asked in new:
            for c in range(asked.req.n):
                self._place(asked, c)
        return True

    def _place(self, asked: _Asked, choice: int) -> None:
        """A row for one choice of a request: its episode's idle row whose ids the prompt continues, else a new one."""
        prompt, ep = list(asked.req.prompt_ids), asked.req.episode
        mine = [i for i, r in enumerate(self.rows) if r is not None and r.asked is None and r.episode == ep]
        fits = [i for i in mine if len(self.rows[i].fed) <= len(prompt) and prompt[: len(self.rows[i].fed)] == self.rows[i].fed]  # type: ignore[union-attr]
        if fits and choice == 0:
            i = max(fits, key=lambda j: len(self.rows[j].fed))  # type: ignore[union-attr]
            row = self.rows[i]
            assert row is not None
            row.pending = prompt[len(row.fed) :]
        else:
            left = [j for j in mine if j not in fits]  # a row its episode left behind (history rewritten)
            i = left[0] if left else next((j for j, r in enumerate(self.rows) if r is None), len(self.rows))
            if i == len(self.rows):
                self.rows.append(None)
            self.rows[i] = row = _Row(ep, pending=prompt)
        row.asked, row.choice, row.sampled, row.logps = asked, choice, [], []
        self.state.num_rows = max(self.state.num_rows, len(self.rows))
        self.state.capacity = max(self.state.capacity, _grown(len(prompt) + asked.req.max_tokens + 1))

    def _fail_all(self, error: BaseException) -> None:
        with self.cond:
            waiting, self.queue = self.queue, []
        for i, row in enumerate(self.rows):
            if row is not None and row.asked is not None:
                waiting.append(row.asked)
                self.rows[i] = None  # its cache may be half written
        for asked in waiting:
            asked.error = asked.error or error
            asked.done.set()

    # ------------------------------------------------------------ feeding and sampling

    def _feed_chunks(self) -> None:
        """Every row's pending ids, rows with chunks of one length in one forward."""
        by_len: dict[int, list[int]] = {}
        for i, r in enumerate(self.rows):
            if r is not None and r.pending:
                by_len.setdefault(len(r.pending), []).append(i)
        for rows in by_len.values():
            self._forward(rows, [self.rows[i].pending for i in rows])  # type: ignore[union-attr]

    def _forward(self, rows: list[int], chunks: Sequence[Sequence[int]]) -> None:
        """Feed each row its chunk (all of one length m); each row's logits after it."""
        live = [self.rows[i] for i in rows]
        m = len(chunks[0])
        ids = torch.tensor([list(c) for c in chunks], device=self.device)  # [n, m]
        start = torch.tensor([len(r.fed) for r in live], device=self.device)  # type: ignore[union-attr]
        self.state.prepare(torch.tensor(rows, device=self.device), start, m, torch.float32)
        out = self.model(
            input_ids=ids, position_ids=start[:, None] + torch.arange(m, device=self.device), use_cache=True,
            rlvr_rows=self.state, logits_to_keep=1, **{self.ckw: self.cache},
        )  # fmt: skip
        self.forwards += 1
        self.tokens_fed += ids.numel()
        logits = out.logits[:, -1].float()  # [n, V]
        for r, chunk, lg in zip(live, chunks, logits):
            assert r is not None
            r.fed, r.pending, r.logits = r.fed + list(chunk), [], lg

    def _step(self) -> None:
        """Every sampling row draws a token; rows not finished feed it (one forward)."""
        sampling = [i for i, r in enumerate(self.rows) if r is not None and r.asked is not None and not r.pending]
        if not sampling:
            return
        drawn = self._draw(sampling)
        going = []
        for i in sampling:
            row = self.rows[i]
            assert row is not None and row.asked is not None
            token, logp = drawn[i]
            row.sampled.append(token)
            row.logps.append(logp)
            finish = self._finish(row, token)
            if finish is None:
                going.append(i)
            else:
                self._answer(row, finish)
        if going:
            self._forward(going, [[self.rows[i].sampled[-1]] for i in going])  # type: ignore[union-attr]

    def _draw(self, rows: list[int]) -> dict[int, tuple[int, float]]:
        """(token, log-prob) per row. Each request's generator draws n numbers per step (row `choice` takes its own),
        as HFEngine draws G per prompt, so that a reply is what engine.generate would sample for its seed."""
        uniforms: dict[int, torch.Tensor] = {}
        for i in rows:
            asked = self.rows[i].asked  # type: ignore[union-attr]
            assert asked is not None
            if id(asked) not in uniforms and asked.req.temperature > 0:
                uniforms[id(asked)] = torch.rand(asked.req.n, generator=asked.gen, device=self.device)
        out: dict[int, tuple[int, float]] = {}
        groups: dict[tuple, list[int]] = {}
        for i in rows:
            req = self.rows[i].asked.req  # type: ignore[union-attr]
            groups.setdefault((req.temperature, req.top_p), []).append(i)
        for (temperature, top_p), idx in groups.items():
            x = torch.stack([self.rows[i].logits for i in idx])  # type: ignore[union-attr, misc]
            if temperature == 0:
                out.update({i: (int(t), 0.0) for i, t in zip(idx, x.argmax(-1).tolist())})
                continue
            u = torch.stack([uniforms[id(self.rows[i].asked)][self.rows[i].choice] for i in idx])  # type: ignore[union-attr]
            token, logp, _ = sample_tokens(x, u, temperature=temperature, top_p=top_p, entropy=False, overwrite=True)
            out.update({i: (int(t), float(lp)) for i, t, lp in zip(idx, token.tolist(), logp.tolist())})
        return out

    def _finish(self, row: _Row, token: int) -> str | None:
        asked = row.asked
        assert asked is not None
        if token in self.eos or asked.stop(row.sampled):
            return "stop"
        return "length" if len(row.sampled) >= asked.req.max_tokens else None

    def _answer(self, row: _Row, finish: str) -> None:
        """The row's sample is done; the row goes idle (its last token unfed: the logits after `fed` still hold)."""
        asked = row.asked
        assert asked is not None
        asked.samples[row.choice] = Sample(list(row.sampled), list(row.logps), finish)
        row.asked, row.sampled, row.logps = None, [], []
        if all(s is not None for s in asked.samples):
            asked.done.set()


def _grown(need: int) -> int:
    """Capacities double from 64: buffers are reallocated a few times per collection, not per request."""
    cap = 64
    while cap < need:
        cap *= 2
    return cap
