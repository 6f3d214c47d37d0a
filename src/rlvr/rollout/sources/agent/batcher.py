"""One decode for many agents' requests: the batcher between the endpoint and the sampler.

With the hf engine the endpoint uses its continuous decoder instead (rlvr.rollout.engines.hf.continuous:
requests join the decode at the next token, and an agent's next call feeds only its new tokens); the
Batcher serves every other sampler (generation servers, vLLM, rlvr serve).

Each HTTP request thread submits a Job (prompt ids, budget, seed, sampling settings) and waits.
The batcher's thread takes every job waiting, after waiting a few milliseconds for more, or less
when every open episode already has a request pending, groups them by sampling settings (n,
temperature, top_p, stop strings; budgets may differ) and makes one sampler call per group: 32
agents calling at once make one batched decode, not 32 serial ones. While a decode runs, new
requests queue up for the next one.

The sampler is `sample(GenerateRequest) -> samples[prompt][choice]` (rlvr.rollout.engines.remote.protocol):
`engine_sampler(engine, tokenizer)` adapts a GenerationEngine; a generation server's client
(`lambda req: client.generate(req).samples`) and rlvr serve's HFBackend fit as they are.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from rlvr.rollout.engines.protocols import GenerationEngine, SamplingParams
from rlvr.rollout.engines.remote.protocol import GenerateRequest, Sample
from rlvr.rollout.engines.turns import StopMatcher

Sampler = Callable[[GenerateRequest], "list[list[Sample]]"]


class Scheduler(Protocol):
    """What the endpoint hands each request to: the Batcher below, or the hf engine's continuous decoder
    (rlvr.rollout.engines.hf.continuous.ContinuousDecoder: requests join and leave the decode token by token)."""

    def submit(self, job: Job) -> list[Sample]: ...

    def drive(self, until: Callable[[], bool]) -> None:
        """Serve from the calling thread until `until()` holds (one with a thread of its own just waits)."""
        ...

    def close(self) -> None: ...


@dataclass
class Job:
    prompt_ids: list[int]
    max_tokens: int
    seed: int
    n: int
    temperature: float
    top_p: float
    stops: tuple[str, ...]
    episode: str
    done: threading.Event = field(default_factory=threading.Event)
    samples: list[Sample] | None = None
    error: BaseException | None = None

    @property
    def settings(self) -> tuple:
        return (self.n, self.temperature, self.top_p, self.stops)


class Batcher:
    """`pending_target()`: how many episodes are open; a batch starts at once when each has a job waiting.
    `own_thread=False`: the caller samples on its own thread inside drive() (the trainer's main thread)."""

    def __init__(self, sample: Sampler, pending_target: Callable[[], int], wait: float = 0.01, own_thread: bool = True):
        self.sample, self.pending_target, self.wait = sample, pending_target, wait
        self.queue: list[Job] = []
        self.cond = threading.Condition()
        self.closed = False
        self.calls = 0  # sampler calls made
        self.jobs = 0  # jobs answered
        self.thread: threading.Thread | None = None
        if own_thread:
            self.thread = threading.Thread(target=self._loop, name="rlvr-agent-batcher", daemon=True)
            self.thread.start()

    def submit(self, job: Job) -> list[Sample]:
        with self.cond:
            if self.closed:
                raise RuntimeError("the agent endpoint is closed")
            self.queue.append(job)
            self.cond.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.samples is not None
        return job.samples

    def drive(self, until: Callable[[], bool]) -> None:
        if self.thread is not None:  # its own thread samples
            while not until():
                time.sleep(0.02)
            return
        while not self.closed and not until():
            self._serve(self._take(until))

    def close(self) -> None:
        with self.cond:
            self.closed = True
            left, self.queue = self.queue, []
            self.cond.notify_all()
        for job in left:
            job.error = RuntimeError("the agent endpoint closed before this request was sampled")
            job.done.set()

    def _take(self, until: Callable[[], bool] | None = None) -> list[Job]:
        with self.cond:
            while not self.queue and not self.closed:
                if until is not None and until():
                    return []
                self.cond.wait(None if until is None else 0.02)  # driven: `until` may turn true without a notify
            deadline = time.monotonic() + self.wait
            while not self.closed and len({j.episode for j in self.queue}) < self.pending_target():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            jobs, self.queue = self.queue, []
            return jobs

    def _loop(self) -> None:
        while not self.closed:
            self._serve(self._take())

    def _serve(self, jobs: list[Job]) -> None:
        groups: dict[tuple, list[Job]] = {}
        for job in jobs:
            groups.setdefault(job.settings, []).append(job)
        for group in groups.values():
            self._run(group)

    def _run(self, jobs: list[Job]) -> None:
        first = jobs[0]
        req = GenerateRequest(
            prompt_ids=[j.prompt_ids for j in jobs],
            n=first.n,
            seeds=[j.seed for j in jobs],
            max_tokens=[j.max_tokens for j in jobs],
            temperature=first.temperature,
            top_p=first.top_p,
            stop_strings=list(first.stops),
        )
        try:
            self.calls += 1
            out = self.sample(req)
            for job, samples in zip(jobs, out, strict=True):
                job.samples = samples
        except BaseException as e:  # every waiting request answers the error; the batcher goes on
            for job in jobs:
                job.error = e
        finally:
            self.jobs += len(jobs)
            for job in jobs:
                job.done.set()


def engine_sampler(engine: GenerationEngine, tokenizer) -> Sampler:
    """A Sampler on engine.generate with token-id prompts (the hf engine takes them): one decode to the
    longest budget of the batch, each sample then cut at its prompt's budget and its first stop string."""

    def sample(req: GenerateRequest) -> list[list[Sample]]:
        params = SamplingParams(req.n, req.temperature, req.top_p, req.top_k, max(req.max_tokens), req.ignore_eos)
        gen = engine.generate(req.prompt_ids, params, req.seeds)  # type: ignore[arg-type]
        stop = StopMatcher(tokenizer, req.stop_strings)
        out = []
        for i, budget in enumerate(req.max_tokens):
            per = []
            for r in range(i * req.n, (i + 1) * req.n):
                keep = gen.completion_mask[r].bool()
                ids, lps = gen.completion_ids[r][keep].tolist(), gen.sampling_logprobs[r][keep].tolist()
                per.append(_cut(ids, lps, "length" if bool(gen.truncated[r]) else "stop", budget, stop))
            out.append(per)
        return out

    return sample


def _cut(ids: list[int], lps: list[float], finish: str, budget: int, stop: StopMatcher) -> Sample:
    """The sample as if decoding had ended at its first stop string or its budget (the tokens before
    do not depend on those after)."""
    for t in range(min(len(ids), budget)):
        if stop(ids[: t + 1]):
            return Sample(ids[: t + 1], lps[: t + 1], "stop")
    if len(ids) > budget:
        return Sample(ids[:budget], lps[:budget], "length")
    return Sample(ids, lps, finish)
