"""Calls from the training loop to code that watches it (rlvr.GRPOTrainer's transformers callbacks).

A hook sees the Trainer after each point of the run and may ask it to stop after the step that
just ended; the stop is the one a first Ctrl-C makes (a checkpoint, a resumable run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class RunHooks(Protocol):
    def train_begin(self, trainer) -> None:
        """Before the first step (after a resume: before the first step still to train)."""

    def step_begin(self, trainer) -> None:
        """Before step trainer.state.step + 1 generates."""

    def step_end(self, trainer, metrics: dict) -> bool:
        """After step trainer.state.step was trained and logged; True: stop the run here."""
        ...

    def evaluated(self, trainer, metrics: dict) -> None:
        """After a held-out evaluation: eval/reward and, with eval.samples > 1, eval/pass@k and friends."""

    def saved(self, trainer, path: Path) -> None:
        """After a checkpoint was written to `path`."""

    def train_end(self, trainer, summary: dict) -> None:
        """At the end of the run, finished or stopped (not after an error)."""


class NoHooks:
    def train_begin(self, trainer) -> None:
        pass

    def step_begin(self, trainer) -> None:
        pass

    def step_end(self, trainer, metrics: dict) -> bool:
        return False

    def evaluated(self, trainer, metrics: dict) -> None:
        pass

    def saved(self, trainer, path: Path) -> None:
        pass

    def train_end(self, trainer, summary: dict) -> None:
        pass
