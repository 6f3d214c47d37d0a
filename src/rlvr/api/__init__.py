"""rlvr's Python API: what the CLI runs, callable from a script or a notebook.

- `run.py`: `train(config, *overrides) -> Run` (a Config, a dict or a YAML path, plus dotted overrides).
- `evaluation.py`: `evaluate(model, ...)`, the held-out score (`rlvr eval`).
- `trl_config.py`: `GRPOConfig`, TRL 1.16's fields and defaults, each mapped to rlvr's config or refused by name.
- `trl_trainer.py`: `GRPOTrainer`, TRL 1.16's arguments (Python objects: callables, datasets, models) over rlvr's Trainer.
- `callbacks.py`: transformers `TrainerCallback`s called from rlvr's loop (state, control.should_training_stop).
"""

from __future__ import annotations

_NAMES = {
    "train": "rlvr.api.run",
    "Run": "rlvr.api.run",
    "evaluate": "rlvr.api.evaluation",
    "GRPOConfig": "rlvr.api.trl_config",
    "GRPOTrainer": "rlvr.api.trl_trainer",
}
__all__ = list(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        import importlib

        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'rlvr.api' has no attribute {name!r}")
