"""Asynchronous off-policy steps (`rollout.max_staleness` k > 0): the next steps' rollouts are made
in a background thread while the trainer updates.

`AheadSource` wraps the run's rollout source. Its thread reads the prompt stream ahead (a fork of
it: the trainer's own stream, and so the checkpoints, move only as batches are consumed) and makes
the episodes of step s once the servers hold weights of version s - k or newer, at most k batches
ahead; the collect phase then finds them ready. Each batch is keyed by its rows' seeds, which name
their stream positions: a batch the collect phase asks for that the thread has not made (a dynamic
sampling round, a resume) is made on the spot, and the thread starts again from where the stream
really is. Rows older than k versions are dropped by the Collector, not here: this class only
overlaps generation with training. The episodes are those a synchronous run would make with the
same seeds, under older weights.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from rlvr.rollout.episodes import Episodes, RolloutSource


@dataclass
class AheadStats:
    waited_for_rollouts: float = 0.0  # seconds the collect phase waited for the thread's batch
    waited_for_weights: float = 0.0  # seconds the thread waited for newer weights before it could start a batch
    made_ahead: int = 0  # batches the collect phase found made ahead
    made_on_demand: int = 0  # batches it had to make itself


class AheadSource:
    """RolloutSource: the wrapped source's episodes, made up to k steps ahead in a thread."""

    def __init__(
        self,
        source: RolloutSource,
        stream,
        *,
        max_staleness: int,
        prompts_per_step: int,
        seeds_of: Callable[[int, int], list[int]],
        share: Callable[[int], slice],
        weights_version: Callable[[], int | None],
    ):
        """`seeds_of(position, n)`: the seeds of n rows from that stream position; `share(n)`: this rank's slice of n rows;
        `weights_version()`: the version the servers hold (None before the first sync)."""
        self.source, self.k, self.n = source, max_staleness, prompts_per_step
        self.seeds_of, self.share, self.weights_version = seeds_of, share, weights_version
        self.stats = AheadStats()
        self._stream = stream.fork()
        self._ready: dict[tuple[int, ...], Episodes] = {}
        self._cv = threading.Condition()
        self._rollout_lock = threading.Lock()  # the wrapped source makes one batch at a time
        self._error: BaseException | None = None
        self._stopped = False
        self._in_flight: tuple[int, ...] | None = None
        self._thread: threading.Thread | None = None
        self._next_step, self._next_position = 0, 0

    @property
    def group_size(self) -> int:
        return self.source.group_size

    def metrics(self, episodes: Episodes) -> dict[str, float]:
        return self.source.metrics(episodes)

    def sync_weights(self) -> None:
        self.source.sync_weights()
        with self._cv:
            self._cv.notify_all()

    def __getattr__(self, name: str) -> Any:  # the wrapped source's notes, reward columns, ...
        if name.startswith("_") or name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)

    # ---------------------------------------------------------------- the consumer side

    def start(self, step: int, position: int) -> None:
        """Make batches ahead from step `step`, whose prompts start at stream position `position` (after a resume too)."""
        with self._cv:
            self._ready.clear()
            self._next_step, self._next_position = step, position
            self._cv.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rlvr-rollouts-ahead", daemon=True)
            self._thread.start()

    def take_stats(self) -> AheadStats:
        stats, self.stats = self.stats, AheadStats()
        return stats

    def _mine(self, position: int) -> tuple[int, ...]:
        return tuple(self.seeds_of(position, self.n)[self.share(self.n)])

    def rollout(self, rows: list[dict], seeds: list[int]) -> Episodes:
        key, t0 = tuple(seeds), time.perf_counter()
        with self._cv:
            while self._error is None and key not in self._ready and self._expected(key):
                self._cv.wait(0.1)
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            episodes = self._ready.pop(key, None)
        if episodes is not None:
            self.stats.waited_for_rollouts += time.perf_counter() - t0
            self.stats.made_ahead += 1
            return episodes
        self.stats.made_on_demand += 1
        with self._rollout_lock:
            return self.source.rollout(rows, seeds)

    def _expected(self, key: tuple[int, ...]) -> bool:
        """The thread is making this batch now, or will make it next."""
        return key == self._in_flight or (not self._stopped and key == self._mine(self._next_position) and self._may_start())

    def after_collect(self, step: int, position: int) -> None:
        """The batch of step `step` starts at stream position `position`: what the thread made from there on in steps of
        prompts_per_step is kept; anything else (a dynamic-sampling round drew more prompts) is dropped and it starts over."""
        with self._cv:
            ahead = self._next_position - position
            if ahead < 0 or ahead % self.n or self._next_step - step != ahead // self.n:
                self._ready.clear()
                self._next_step, self._next_position = step, position
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        while True:
            with self._cv:
                t0 = time.perf_counter()
                while not self._stopped and not self._may_start():
                    self._cv.wait(0.1)
                self.stats.waited_for_weights += time.perf_counter() - t0
                if self._stopped:
                    return
                step, position = self._next_step, self._next_position
                key = self._mine(position)
                self._in_flight = key
            try:
                part = self.share(self.n)
                rows = self._stream.rows_at(position, self.n)[part]
                with self._rollout_lock:
                    episodes = self.source.rollout(rows, list(key))
            except BaseException as e:  # handed to the collect phase, which raises it in the trainer's thread
                with self._cv:
                    self._error, self._in_flight, self._stopped = e, None, True
                    self._cv.notify_all()
                return
            with self._cv:
                self._in_flight = None
                if (self._next_step, self._next_position) == (step, position):  # not restarted meanwhile
                    self._ready[key] = episodes
                    self._next_step, self._next_position = step + 1, position + self.n
                self._cv.notify_all()

    def _may_start(self) -> bool:
        """At most k batches wait, and the next one's rows will be at most k versions older than the weights they train."""
        version = self.weights_version()
        return version is not None and len(self._ready) < self.k + 1 and self._next_step - version <= self.k
