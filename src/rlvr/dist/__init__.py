"""Data parallelism over torch.distributed: the only package of rlvr that touches it.

Launch with `torchrun --nproc_per_node N -m rlvr train ...` (or `rlvr train nproc=N`, which runs
torchrun itself). Each rank generates and scores its own whole groups of the step's prompts,
with the same weights; reward statistics, loss normalisers and metrics are reduced across ranks
so the update equals one process doing the whole batch. Both DDP and FSDP2 are tested on
CPU/gloo against one process (tests/dist/test_dist.py); neither has run on nccl yet.

| file | what |
|---|---|
| `group.py` | `Dist`: this process's rank, the job's strategy (fixed when joined), named collectives, heartbeats; torchrun |
| `parallel.py` | wrapping the model in DDP or FSDP2, and what that changes for the loop: gradient sync, loss scale, generation |
| `state_dicts.py` | full (unsharded) weights and optimizer state of an FSDP2 model, for checkpoints that resume anywhere |
| `transfer.py` | weights from the trainer to a generation server: one two-process group per server (gloo / NCCL), staged |

With one process (no torchrun environment) every function here is a cheap identity, and
torch.distributed is never initialised.
"""

from rlvr.dist.group import Dist, DistError, initialized_world_size, launch_command, under_torchrun
from rlvr.dist.parallel import full_weights_for_generation, loss_scale, no_grad_sync, wrap
from rlvr.dist.state_dicts import full_model_state, full_optimizer_state, load_full_model_state, load_full_optimizer_state

__all__ = [
    "Dist", "DistError", "full_model_state", "full_optimizer_state", "full_weights_for_generation", "initialized_world_size",
    "launch_command",
    "load_full_model_state", "load_full_optimizer_state", "loss_scale", "no_grad_sync", "under_torchrun", "wrap",
]
