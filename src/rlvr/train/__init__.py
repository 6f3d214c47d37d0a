"""Training: the loop (trainer.py) and what it is made of — the batch plan (every derived value
resolved once), collecting scored episodes (collect.py), the update (update.py), fast paths,
the split across ranks, checkpoint state, run control, the run folder (run_folder.py: what resuming may
change) and held-out evaluation."""

from rlvr.train.run_control import StopAtOnce, TrainingError
from rlvr.train.run_folder import RunFinished
from rlvr.train.trainer import StepRecord, Trainer

__all__ = ["RunFinished", "StepRecord", "StopAtOnce", "Trainer", "TrainingError"]
