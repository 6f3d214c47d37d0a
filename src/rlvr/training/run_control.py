"""Run control around the loop: stop requests, the learning-rate schedule, seeding."""

from __future__ import annotations

import math
import os
import random
import signal
import threading

from pathlib import Path

import numpy as np
import torch

from rlvr.training.checkpoint import latest_checkpoint


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. repeated non-finite losses); the last good checkpoint is kept."""


class AbandonStep(BaseException):
    """A second stop signal during a phase that changes nothing lasting (generation, evaluation): drop it."""


class StopAtOnce(BaseException):
    """A third stop signal: exit now; the newest complete checkpoint is what is left."""


class StopRequest:
    """SIGINT, SIGTERM and SIGHUP (the terminal closed) stop a run without losing it, each said at once on stderr:

    1st: the step under way finishes, a checkpoint is written, the run exits cleanly.
    2nd: the step is abandoned where that changes nothing lasting (its generation, an evaluation) and the last
         complete step is checkpointed; during the update or a write it finishes first (one process only: ranks
         must stop together).
    3rd: exit at once; checkpoints are written whole or not at all, so the newest complete one is kept.

    The loop tells it where it is: `step` (the step under way), `phase` and `abandonable`."""

    SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))

    def __init__(self):
        self.requested: str | None = None
        self.count = 0
        self.step, self.phase, self.abandonable = 0, "starting", False
        self._previous = {}
        self._terminal_fds = [fd for fd in (1, 2) if os.isatty(fd)]  # known now: a hung-up terminal no longer says it is one
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)

    def at(self, step: int, phase: str, *, abandonable: bool = False) -> None:
        self.step, self.phase, self.abandonable = step, phase, abandonable

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        self.count += 1
        if signum == getattr(signal, "SIGHUP", None):
            _detach_from_closed_terminal(self._terminal_fds)
        if self.count == 1:
            self.requested = name
            if self.phase == "end":
                _say(f"[stop] {name}: the run is writing its end (checkpoint, final model, evaluation) and stops when done")
            else:
                _say(
                    f"[stop] {name}: finishing step {self.step} ({self.phase}), then writing a checkpoint and exiting; "
                    f"{name} again to stop sooner"
                )
        elif self.count == 2 and self.abandonable:
            _say(f"[stop] second {name}: abandoning step {self.step}'s {self.phase}; checkpointing step {self.step - 1} and exiting")
            raise AbandonStep
        elif self.count == 2:
            _say(
                f"[stop] second {name}: step {self.step}'s {self.phase} must finish for a consistent checkpoint; "
                f"{name} a third time exits at once, keeping the newest complete checkpoint"
            )
        else:
            _say(f"[stop] {name} again: exiting at once")
            raise StopAtOnce

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _say(line: str) -> None:
    """One line on stderr from a signal handler: a raw write (no locks a handler could deadlock on)."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:  # the terminal is gone
        pass


def _detach_from_closed_terminal(fds: list[int]) -> None:
    """After SIGHUP, writing to the terminal that went away fails (EIO) and would end the run before
    its checkpoint: stdout/stderr that were that terminal now go to /dev/null. Pipes and files stay."""
    if not fds:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in fds:
        os.dup2(devnull, fd)
    os.close(devnull)


def lr_lambda(schedule: str, warmup: int, total: int, *, min_lr_rate: float = 0.0, warmup_from_zero: bool = False):
    """The learning rate of optimizer update `update` (0, 1, ...) as a share of optim.lr: a linear warm-up over
    `warmup` updates (update u at (u + 1) / warmup, or at u / warmup from 0 as transformers' schedules), then
    constant, linear to 0, or cosine down to min_lr_rate at update `total` (transformers' cosine_with_min_lr)."""

    def f(update: int) -> float:
        if warmup and update < warmup:
            return (update if warmup_from_zero else update + 1) / warmup
        progress = min(1.0, (update - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - progress
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress)) * (1 - min_lr_rate) + min_lr_rate
        return 1.0

    return f


def say_bad_step(state, max_bad_steps: int, checkpoints: Path, log) -> None:
    """A step whose loss or gradient was not finite (its update skipped): say so, and stop the run with a
    TrainingError after `max_bad_steps` of them in a row, naming the last good checkpoint."""
    log.info(f"[warning] step {state.step}: non-finite loss or gradient, update skipped ({state.skipped_steps} so far)")
    if state.bad_steps_in_a_row >= max_bad_steps:
        last = latest_checkpoint(checkpoints)
        raise TrainingError(
            f"{state.bad_steps_in_a_row} steps in a row had a non-finite loss or gradient (max_bad_steps={max_bad_steps}); "
            f"stopping. Last good checkpoint: {last or 'none'}. Lower optim.lr or check the rewards."
        )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
