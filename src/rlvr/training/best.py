"""checkpoint.best_metric: the evaluation during training that did best so far (TRL's metric_for_best_model). Its
value and step live in the TrainState, so a resumed run goes on comparing with them; the checkpoint of that step
outlives checkpoint.keep (rlvr.training.checkpoint.save_checkpoint's `protect`), and with checkpoint.load_best_at_end
final/ gets its weights."""

from __future__ import annotations

import math

from rlvr.config import Config
from rlvr.training.run_control import TrainingError
from rlvr.training.state import TrainState


def improves(cfg: Config, state: TrainState, metrics: dict) -> bool:
    """Whether the evaluation in `metrics` (after step state.step) beats checkpoint.best_metric's best so far; if so it
    becomes the best (ties keep the earlier step). A NaN never does."""
    c = cfg.checkpoint
    if c.best_metric is None:
        return False
    if c.best_metric not in metrics:
        held_out = sorted(k for k in metrics if k.startswith("eval/"))
        raise TrainingError(f"checkpoint.best_metric={c.best_metric} is not among this run's held-out metrics: {', '.join(held_out)}")
    value = float(metrics[c.best_metric])
    if math.isnan(value):
        return False
    if state.best_value is not None and not (value > state.best_value if c.greater_is_better else value < state.best_value):
        return False
    state.best_value, state.best_step = value, state.step
    return True


def summary(cfg: Config, state: TrainState) -> dict:
    """summary.json's best_* fields (none without checkpoint.best_metric)."""
    if cfg.checkpoint.best_metric is None:
        return {}
    return {"best_metric": cfg.checkpoint.best_metric, "best_value": state.best_value, "best_step": state.best_step}
