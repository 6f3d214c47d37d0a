"""The batch plan printed at start-up is what runs: its micro-batch size and pass count bound the
micro-batches every update executes, and its fast-path switches are the resolved ones."""

from __future__ import annotations

import re

import pytest

from rlvr.training.batch_plan import BatchPlan

CASES = {
    # overrides -> (micro-batch size printed, most passes printed, exact sizes of a step when known)
    "fixed micro-batches": (
        ["optim.micro_batch_size=4", "optim.skip_zero_advantage=false", "optim.pack_by_length=false"],
        4,
        4,
        [4, 4, 4, 4],
    ),
    "whole step": (["optim.micro_batch_size=0", "optim.skip_zero_advantage=false", "optim.pack_by_length=false"], 16, 1, [16]),
    "uneven": (["optim.micro_batch_size=6", "optim.skip_zero_advantage=false", "optim.pack_by_length=false"], 6, 3, [6, 6, 4]),
    "packing, whole step": (["optim.micro_batch_size=0"], 16, 4, None),
    "packing, micro-batches": (["optim.micro_batch_size=8"], 8, 2, None),
    "bnpo: no skipping, no packing": (["algo.loss_type=bnpo", "optim.micro_batch_size=0"], 16, 1, None),
}


def _printed(plan: BatchPlan) -> tuple[int, int]:
    m = re.search(r"micro-batch (\d+) completions -> at most (\d+) forward/backward", plan.describe())
    assert m, plan.describe()
    return int(m[1]), int(m[2])


@pytest.mark.parametrize("case", list(CASES))
def test_printed_plan_is_what_runs(make_trainer, case):
    overrides, size, passes, exact = CASES[case]
    t = make_trainer(
        "rollout.group_size=4",
        "rollout.prompts_per_step=4",
        "rollout.max_new_tokens=6",
        "steps=4",
        *overrides,
        run=re.sub(r"\W+", "_", case),
    )
    assert _printed(t.plan) == (size, passes)
    for _ in range(4):
        t.train_step()
        run = t.last_step.micro_batch_sizes
        kept = int((t.last_step.advantages != 0).sum()) if t.plan.skip_zero_advantage else len(t.last_step.advantages)
        assert sum(run) == kept  # every row that runs, runs once
        assert len(run) <= passes and all(0 < n <= size for n in run)
        if exact is not None:
            assert run == exact


def test_fast_paths_are_resolved_once(make_trainer):
    """The plan holds the resolved switches; the printed text names the ones in force."""
    t = make_trainer("optim.shared_prefix=true", "model.gradient_checkpointing=true", "algo.beta=0.1", run="resolved")
    assert (t.plan.shared_prefix, t.plan.skip_zero_advantage) == (False, False)  # checkpointing; a KL term
    assert "shared" not in t.plan.describe() and "advantage 0 skipped" not in t.plan.describe()
    t = make_trainer(run="defaults")
    assert (t.plan.shared_prefix, t.plan.skip_zero_advantage, t.plan.pack_by_length) == (True, True, True)
    assert "advantage 0 skipped" in t.plan.describe() and "shared by its group" in t.plan.describe()
    assert t.plan.micro_batch_size == t.cfg.rollout.prompts_per_step * t.cfg.rollout.group_size
