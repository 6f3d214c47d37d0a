"""Training: the loop and what it is made of (the Python API's `rlvr.train(config)` that runs it is rlvr.api.run).

trainer.py         the loop: a step in four numbered phases (rollout and score, advantages, update;
                   metrics, doctor, checkpoint), the run around it (evaluation, stop, the end)
collect.py         phase 1: the Collector (prompt stream, rollout source, reward runner, dynamic
                   sampling, the gather across ranks) and the Batch it gives
minibatches.py     the batch as minibatches of whole groups, and this rank's share of each
update.py          phase 3: the Updater (epochs, minibatches, micro-batches)
update_inputs.py   what the update reads (a minibatch's frozen inputs, micro-batches) and returns
update_metrics.py  the update's metrics, summed on the device
entropy_steering.py  algo.adaptive_entropy in the update: the coefficient applied, the entropy measured
step_metrics.py    the batch's metrics, the completions table, the last step's record
batch_plan.py      every derived batch value resolved once; fast_paths.py: work the update may leave out
setup.py           checking the config against the registries; device, precision, training prompts
state.py           the train state and its checkpoints (checkpoint.py: the files)
run_folder.py      the run folder: what resuming may change, atomic writes, final/
run_control.py     stop requests, the learning-rate schedule, seeding
reward_health.py   reward functions that fail, seen at once
evaluation.py      held-out evaluation; eval_command.py: `rlvr eval`

"""

from rlvr.training.run_control import StopAtOnce, TrainingError
from rlvr.training.run_folder import RunFinished
from rlvr.training.step_metrics import StepRecord
from rlvr.training.trainer import Trainer

__all__ = ["RunFinished", "StepRecord", "StopAtOnce", "Trainer", "TrainingError"]
