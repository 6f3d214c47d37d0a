"""transformers `TrainerCallback`s run by rlvr's loop (rlvr.training.hooks.RunHooks), with TRL's counting.

The callbacks get what transformers' Trainer gives them: `args` (the GRPOConfig), a `TrainerState` whose
`global_step` counts optimizer steps as TRL does (rlvr's step x optimizer steps per step), a `TrainerControl`
whose `should_training_stop` ends the run after the step (with a checkpoint, resumable), and the keywords
model, processing_class, optimizer and lr_scheduler. Called: on_init_end, on_train_begin, on_epoch_begin/end,
on_step_begin/end, on_log, on_evaluate, on_save, on_train_end; not called (rlvr's loop has no such point a
callback could act on): on_substep_end, on_pre_optimizer_step, on_optimizer_step, on_prediction_step.
`on_log` runs every `logging_steps` optimizer steps with the numeric metrics averaged since the last log (TRL
averages its metrics over the logging window), and its logs go to `state.log_history`, as in transformers.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from transformers import TrainerControl, TrainerState


class CallbackHooks:
    """RunHooks calling transformers callbacks."""

    def __init__(self, callbacks: list, args, *, updates_per_step: int, steps: int):
        self.callbacks = [c() if isinstance(c, type) else c for c in callbacks]
        self.args, self.updates_per_step = args, updates_per_step
        every = args.logging_steps
        self.log_every = max(1, math.ceil(every * steps * updates_per_step)) if 0 < every < 1 else max(1, int(every))
        self.state = TrainerState(
            max_steps=steps * updates_per_step,
            logging_steps=self.log_every,
            save_steps=args.save_steps,
            eval_steps=args.eval_steps,
            num_train_epochs=int(math.ceil(args.num_train_epochs)),
            is_local_process_zero=True,
            is_world_process_zero=True,
        )
        self.control = TrainerControl()
        self._window: list[dict] = []
        self._losses: list[float] = []
        self._started = 0.0
        self._epoch = 0  # the dataset pass the run is in (state.epoch counts rows handed out / rows)

    def call(self, event: str, trainer, **kwargs: Any) -> None:
        """Run `event` on every callback, as transformers' CallbackHandler does (a returned control replaces ours)."""
        policy = trainer.policy
        common = {"model": policy.peft or policy.model, "processing_class": trainer.tokenizer}
        common.update(optimizer=trainer.optimizer, lr_scheduler=trainer.scheduler, train_dataloader=None, eval_dataloader=None)
        for cb in self.callbacks:
            result = getattr(cb, event)(self.args, self.state, self.control, **common, **kwargs)
            if result is not None:
                self.control = result

    def _counters(self, trainer) -> None:
        self.state.global_step = trainer.state.step * self.updates_per_step
        self.state.epoch = trainer.stream.epoch
        self.state.is_world_process_zero = self.state.is_local_process_zero = trainer.dist.is_main
        if (best := trainer.state.best_step) is not None:  # checkpoint.best_metric (TRL's metric_for_best_model)
            self.state.best_metric, self.state.best_global_step = trainer.state.best_value, best * self.updates_per_step
            path = trainer.checkpointer.best_checkpoint(trainer.state)
            self.state.best_model_checkpoint = None if path is None else str(path)

    # RunHooks

    def train_begin(self, trainer) -> None:
        self._counters(trainer)
        self._started = time.time()
        self.control.should_training_stop = False
        self.call("on_train_begin", trainer)
        self._epoch = int(self.state.epoch or 0)
        self.call("on_epoch_begin", trainer)

    def step_begin(self, trainer) -> None:
        self._counters(trainer)
        if int(self.state.epoch or 0) > self._epoch:  # a pass over the dataset ended with the last step
            self.call("on_epoch_end", trainer)
            self._epoch = int(self.state.epoch or 0)
            self.call("on_epoch_begin", trainer)
        self.call("on_step_begin", trainer)

    def step_end(self, trainer, metrics: dict) -> bool:
        self._counters(trainer)
        self._window.append(metrics)
        if isinstance(metrics.get("loss"), (int, float)):
            self._losses.append(float(metrics["loss"]))
        self.call("on_step_end", trainer)
        strategy = str(getattr(self.args.logging_strategy, "value", self.args.logging_strategy))
        due = strategy == "steps" and self.state.global_step % self.log_every < self.updates_per_step
        due = due or (strategy == "epoch" and int(self.state.epoch or 0) > self._epoch)  # this step ended a pass
        due = due or (self.args.logging_first_step and trainer.state.step == 1)
        last = trainer.state.step >= trainer.cfg.steps
        if strategy != "no" and (due or last or self.control.should_training_stop):
            self.log(trainer, _mean(self._window))
            self._window = []
        return bool(self.control.should_training_stop)

    def log(self, trainer, logs: dict) -> None:
        """transformers' Trainer.log: epoch and step added, appended to log_history, on_log called."""
        logs = {**logs, "epoch": round(self.state.epoch or 0.0, 4)}
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.call("on_log", trainer, logs=logs)

    def evaluated(self, trainer, metrics: dict) -> None:
        self._counters(trainer)  # evaluating after an update: the optimizer steps it made count, as in transformers
        named = {"eval_" + k.removeprefix("eval/"): v for k, v in metrics.items()}
        self.state.log_history.append({**named, "epoch": self.state.epoch, "step": self.state.global_step})
        self.call("on_evaluate", trainer, metrics=named)

    def saved(self, trainer, path: Path) -> None:
        self._counters(trainer)
        self.call("on_save", trainer)

    def train_end(self, trainer, summary: dict) -> None:
        self._counters(trainer)
        runtime = time.time() - self._started
        self.state.log_history.append(
            {
                "train_runtime": runtime,
                "train_steps_per_second": self.state.global_step / runtime if runtime else 0.0,
                "train_loss": self.training_loss,
                "epoch": self.state.epoch,
                "step": self.state.global_step,
            }
        )
        self.call("on_epoch_end", trainer)
        self.call("on_train_end", trainer)

    @property
    def training_loss(self) -> float:
        return sum(self._losses) / len(self._losses) if self._losses else 0.0


def _mean(rows: list[dict]) -> dict:
    """Each numeric metric's mean over the rows that have it (step counters excluded: log_history has its own)."""
    keys = dict.fromkeys(k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    keys.pop("step", None)
    return {k: sum(r[k] for r in rows if k in r) / sum(1 for r in rows if k in r) for k in keys}
