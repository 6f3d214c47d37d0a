"""Run control around the loop: stop requests, the learning-rate schedule, seeding, log truncation."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import threading
from pathlib import Path

import numpy as np
import torch


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. repeated non-finite losses); the last good checkpoint is kept."""


class StopRequest:
    """SIGINT/SIGTERM ask the loop to finish the current step, save a checkpoint and exit cleanly."""

    def __init__(self):
        self.requested: str | None = None
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.requested:  # a second signal: stop now
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def lr_lambda(schedule: str, warmup: int, total: int):
    def f(update: int) -> float:
        if warmup and update < warmup:
            return (update + 1) / warmup
        progress = min(1.0, (update - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - progress
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return f


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep only the lines of steps <= last_step (written atomically)."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= last_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
