"""Reward functions that fail, seen at once: per-step error counts and rates, the metrics reward
functions log (TRL's `log_metric`), and the stop when one function fails on every sample.

A reward function that fails on every sample (raises, times out, returns garbage) gives no
signal: its column is all "not applicable" and the run looks like one whose prompts are too
hard. So after `max_failed_reward_steps` steps in a row in which one function failed on every
sample, the run stops with a TrainingError naming the function and its first error; no
checkpoint is written while a function is failing, so the last one saved is from before.
"""

from __future__ import annotations

from pathlib import Path

from rlvr.rewards import RewardRunner
from rlvr.training.checkpoint import latest_checkpoint
from rlvr.training.run_control import TrainingError


class RewardHealth:
    def __init__(self, runner: RewardRunner, dist, max_failed_steps: int):
        self.runner, self.dist, self.max_failed_steps = runner, dist, max_failed_steps
        self._errors, self._scored = dict(runner.total_errors), runner.total_scored
        self.failed_steps = {name: 0 for name in runner.names}  # steps in a row it failed on every sample

    def step_metrics(self) -> dict:
        """Since the last call (one step, every generation round, every rank): `rewards/<name>/errors`
        (failed samples), `rewards/<name>/error_rate` (their share of the samples scored), and each
        metric reward functions logged, as the mean of the values logged."""
        r = self.runner
        errors = {n: r.total_errors[n] - self._errors[n] for n in r.names}
        scored = r.total_scored - self._scored
        logged = r.take_logged_metrics()
        self._errors, self._scored = dict(r.total_errors), r.total_scored
        if self.dist.enabled:  # each rank scored its share of the batch
            parts = self.dist.all_gather_object((errors, scored, logged), what="reward errors and logged metrics")
            errors = {n: sum(p[0][n] for p in parts) for n in r.names}
            scored = sum(p[1] for p in parts)
            logged = {k: [v for p in parts for v in p[2].get(k, [])] for k in sorted({k for p in parts for k in p[2]})}
        metrics: dict[str, float] = {}
        for n in r.names:
            metrics[f"rewards/{n}/errors"] = errors[n]
            metrics[f"rewards/{n}/error_rate"] = errors[n] / scored if scored else 0.0
            self.failed_steps[n] = self.failed_steps[n] + 1 if scored and errors[n] >= scored else 0
        metrics.update({k: sum(v) / len(v) for k, v in logged.items() if v})
        return metrics

    @property
    def may_checkpoint(self) -> bool:
        """False while a function fails on every sample (and the stop is on): the checkpoint kept
        for resuming is then the last one from before it broke."""
        return not (self.max_failed_steps and any(self.failed_steps.values()))

    def check(self, checkpoints: Path) -> None:
        """Raise TrainingError when a function has failed on every sample for max_failed_steps steps in a row."""
        for name, steps in self.failed_steps.items():
            if self.max_failed_steps and steps >= self.max_failed_steps:
                last = latest_checkpoint(checkpoints)
                raise TrainingError(
                    f"reward function {name!r} failed on every sample for {steps} steps in a row "
                    f"(max_failed_reward_steps={self.max_failed_steps}); stopping. Its first error: "
                    f"{self.runner.first_error.get(name, 'unknown')}. Last good checkpoint: {last or 'none'}. "
                    f"Fix the function or the dataset columns it reads, then resume with resume=auto "
                    f"(max_failed_reward_steps=0 trains on without it)."
                )
