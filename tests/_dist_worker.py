"""One rank of a distributed test run (launched by tests/dist/test_dist.py with RANK/WORLD_SIZE set).

argv: OUT_FILE STEPS key=value ... Runs STEPS train_steps and (rank 0) saves per-step loss,
gradients and the final weights to OUT_FILE. RLVR_TEST_DIE=RANK:STEP makes that rank kill
itself (SIGKILL) inside the update of that step, after its first backward. RLVR_TEST_SAVE_AFTER=K
writes a checkpoint (Trainer.save_checkpoint, every rank calls it) after the K-th step run here.
"""

import os
import signal
import sys

import torch

import rlvr
from rlvr.config import load_config
from rlvr.training import Trainer


def _full(t: torch.Tensor) -> torch.Tensor:
    """A plain, whole copy: FSDP2 parameters and gradients are DTensor shards, gathered here (a
    collective: every rank calls it in the same order)."""
    from torch.distributed.tensor import DTensor

    t = t.detach()
    return (t.full_tensor() if isinstance(t, DTensor) else t).clone()


def main():
    out, steps, overrides = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    torch.set_num_threads(1)
    t = Trainer(load_config(None, overrides))
    die = os.environ.get("RLVR_TEST_DIE", "")
    if die and int(die.split(":")[0]) == t.dist.rank:
        die_step = int(die.split(":")[1])
        orig = t.optimizer.step

        def step_then_maybe_die(*a, **k):
            if t.state.step + 1 == die_step:
                os.kill(os.getpid(), signal.SIGKILL)
            return orig(*a, **k)

        t.optimizer.step = step_then_maybe_die
    record = {"loss": [], "grads": [], "metrics": [], "rlvr_file": rlvr.__file__, "start_step": t.state.step, "strategy": t.dist.strategy}
    save_after = int(os.environ.get("RLVR_TEST_SAVE_AFTER", "0"))
    for k in range(steps):
        if k and k == save_after:
            t.save_checkpoint()
        m = t.train_step()
        record["loss"].append(m["loss"])
        record["metrics"].append(m)
        record["grads"].append({n: _full(p.grad) for n, p in t.model.named_parameters() if p.grad is not None})
    if save_after == steps:
        t.save_checkpoint()
    record["weights"] = {n: _full(p) for n, p in t.model.named_parameters()}
    from torch.distributed.tensor import DTensor

    record["sharded"] = any(isinstance(p, DTensor) for p in t.model.parameters())  # FSDP2 really on
    if t.dist.is_main:
        torch.save(record, out)
    t.dist.barrier("test end")
    if t.apart is not None:  # what Trainer.train() does at its end: a rollouts-ahead thread still generating would
        t.apart.close()  # otherwise be cut by the interpreter's exit mid-call (an abort: "terminate called ...")
    t.dist.close()


if __name__ == "__main__":
    main()
