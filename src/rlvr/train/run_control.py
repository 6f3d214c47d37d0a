"""Run control around the loop: stop requests, a used output folder, the learning-rate schedule,
seeding, log truncation."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import threading
import time
from pathlib import Path

import numpy as np
import torch

from rlvr.train.checkpoint import latest_checkpoint


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. repeated non-finite losses); the last good checkpoint is kept."""


# What a run folder may hold; a fresh start in a used folder (--force) moves all of it aside.
RUN_FILES = ("metrics.jsonl", "samples.jsonl", "samples.parquet", "summary.json", "config.yaml", "checkpoints", "tb",
             "final", "final-merged", "report", "wandb")


class StopRequest:
    """SIGINT, SIGTERM and SIGHUP (the terminal closed) ask the loop to finish the current step, save
    a checkpoint and exit cleanly; a second signal stops at once."""

    SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))

    def __init__(self):
        self.requested: str | None = None
        self._previous = {}
        self._terminal_fds = [fd for fd in (1, 2) if os.isatty(fd)]  # known now: a hung-up terminal no longer says it is one
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.requested:  # a second signal: stop now
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        if signum == getattr(signal, "SIGHUP", None):
            _detach_from_closed_terminal(self._terminal_fds)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _detach_from_closed_terminal(fds: list[int]) -> None:
    """After SIGHUP, writing to the terminal that went away fails (EIO) and would end the run before
    its checkpoint: stdout/stderr that were that terminal now go to /dev/null. Pipes and files stay."""
    if not fds:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in fds:
        os.dup2(devnull, fd)
    os.close(devnull)


def holds_a_run(output_dir: Path) -> bool:
    """Whether the folder holds (part of) a run: logged steps, a checkpoint or a final model."""
    metrics = output_dir / "metrics.jsonl"
    return ((metrics.is_file() and metrics.stat().st_size > 0) or latest_checkpoint(output_dir / "checkpoints") is not None
            or (output_dir / "final").exists())


def set_aside(output_dir: Path) -> Path:
    """Move every file of the run in `output_dir` to a new sibling folder `<name>.replaced-<time>`
    (outside the folder, so neither resume=auto nor TensorBoard finds it there); returns that folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = output_dir.with_name(f"{output_dir.name}.replaced-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = output_dir.with_name(f"{output_dir.name}.replaced-{stamp}-{n}")
    target.mkdir(parents=True)
    for name in RUN_FILES:
        if (output_dir / name).exists():
            os.replace(output_dir / name, target / name)
    return target


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
