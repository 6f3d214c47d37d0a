"""What every engine's multi-turn decode shares: the driver Protocol the rollout source
implements, the per-episode trace, and how a turn ends (EOS or a stop string, then the row waits
for its tools or its episode is done; the token budget cuts it), how a waiting row resumes and
how its external tokens join the trace."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, Sequence

SAMPLE, FORCE, WAIT, DONE = range(4)


class TurnDriver(Protocol):
    """What the decode asks the rollout source between turns."""

    stop_strings: Sequence[str]  # a model turn also ends when its text ends with one of these

    def end_turn(self, row: int, turn_ids: list[int], eos: bool) -> bool:
        """Row `row` finished a model turn (its token ids; eos: it ended with EOS). True: the row
        waits for external tokens (tools were started); False: its episode is over."""
        ...

    def ready(self, block: bool) -> dict[int, list[int] | None]:
        """Rows whose external tokens are ready: token ids to feed, or None to end the episode.
        block: wait until at least one row is ready (every row still running is waiting)."""
        ...


@dataclass
class Trace:
    """One episode's tokens after its prompt, exactly as fed to the model."""

    ids: list[int] = field(default_factory=list)
    loss: list[int] = field(default_factory=list)  # 1: sampled by the model; 0: external
    logps: list[float] = field(default_factory=list)  # the sampler's log-prob (0.0 on external tokens)
    turn: list[int] = field(default_factory=list)  # the current model turn's ids
    forced: deque = field(default_factory=deque)
    mode: int = SAMPLE
    truncated: bool = False
    version: int | None = None  # the oldest weight version any of its turns was sampled under (servers); None: the trainer's own


class StopMatcher:
    """Has a turn's text reached a stop string? Checked after each token whose text holds the last
    character of some stop string, on the decoded tail of the turn. The stop may end inside that
    token: BPE vocabularies merge across it (SmolLM2 writes `</calc><` as `</`, `calc`, `><`), so
    "ends with" would miss it and the model would go on to write the tool's result itself. No
    earlier token completed a stop (the turn would have ended there), so any stop in the tail is
    the one this token completed."""

    def __init__(self, tokenizer, stops: Sequence[str]):
        self.tokenizer, self.stops = tokenizer, [s for s in stops if s]
        self.last_chars = {s[-1] for s in self.stops}
        self.tail = max((len(s) for s in self.stops), default=0) + 8  # tokens are at least one character
        self._may_end: dict[int, bool] = {}

    def __call__(self, turn: list[int]) -> bool:
        if not self.stops:
            return False
        t = turn[-1]
        if t not in self._may_end:
            self._may_end[t] = any(c in self.tokenizer.decode([t]) for c in self.last_chars)
        if not self._may_end[t]:
            return False
        text = self.tokenizer.decode(turn[-self.tail :])
        return any(s in text for s in self.stops)


def cut_after_stop(text: str, stops: Sequence[str]) -> str:
    """`text` up to the end of its first stop string (all of it when it holds none): what follows
    is the rest of the token that completed the stop, which stays in context (its id was sampled
    and is trained) but is not part of the call."""
    ends = [i + len(s) for s in stops if s and (i := text.find(s)) >= 0]
    return text[: min(ends)] if ends else text


def eos_ids(model, tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id}
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(gen) if isinstance(gen, (list, tuple)) else ({gen} if gen is not None else set())
    return {i for i in ids if i is not None}


def take_sampled(
    tr: Trace,
    row: int,
    tokens: list[int],
    logps: list[float],
    *,
    driver: TurnDriver,
    stop: StopMatcher,
    eos: set[int],
    ignore_eos: bool,
    budget: int,
) -> None:
    """The model sampled `tokens` (with their log-probs) for row `row`: they join its trace (trained)
    and its turn. A turn ends at EOS or at a stop string: the driver takes it, and the row waits for
    its tools or its episode is done. An episode whose tokens fill the budget ends truncated."""
    tr.ids += tokens
    tr.loss += [1] * len(tokens)
    tr.logps += logps
    tr.turn += tokens
    if tokens:
        ended_eos = tokens[-1] in eos and not ignore_eos
        if ended_eos or stop(tr.turn):
            turn, tr.turn = tr.turn, []
            tr.mode = WAIT if driver.end_turn(row, turn, ended_eos) else DONE
    _cut_at_budget(tr, budget)


def take_external(tr: Trace, budget: int, count: int | None = None) -> list[int]:
    """The row's next `count` (all, by default) waiting external tokens join its trace (loss mask 0, no
    log-prob); once none is left the row samples again. -> those tokens."""
    n = len(tr.forced) if count is None else count
    tokens = [tr.forced.popleft() for _ in range(n)]
    tr.ids += tokens
    tr.loss += [0] * n
    tr.logps += [0.0] * n
    if not tr.forced:
        tr.mode = SAMPLE
    _cut_at_budget(tr, budget)
    return tokens


def _cut_at_budget(tr: Trace, budget: int) -> None:
    if tr.mode != DONE and len(tr.ids) >= budget:
        tr.truncated, tr.mode = True, DONE


def resume_ready(traces: list[Trace], driver: TurnDriver, budget: int) -> None:
    """Ask the driver which waiting rows' external tokens are ready (blocking when no row can run but
    some wait) and resume those rows."""
    runnable = any(tr.mode in (SAMPLE, FORCE) for tr in traces)
    waiting = any(tr.mode == WAIT for tr in traces)
    for r, ext in driver.ready(block=waiting and not runnable).items():
        resume(traces[r], ext, budget)


def resume(tr: Trace, ext: list[int] | None, budget: int) -> None:
    """A waiting row gets its external tokens (cut to the episode's budget), or ends."""
    if ext is None:
        tr.mode = DONE
        return
    room = budget - len(tr.ids)
    if len(ext) >= room:  # the tool output does not fit: the episode ends truncated
        tr.truncated = True
    ext = ext[:room]
    if not ext:
        tr.mode = DONE
        return
    tr.forced.extend(ext)
    tr.mode = FORCE
