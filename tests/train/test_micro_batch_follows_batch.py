"""optim.micro_batch_size bounds the completions per forward/backward; a batch smaller than it (a
shrunk example: fewer prompts per step) runs as one micro-batch with a note, never an error."""

import pytest

from rlvr.config import load_config
from rlvr.training.setup import check_config
from _paths import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_a_micro_batch_larger_than_the_step_trains_the_step_in_one_pass(tmp_path, tiny_model_dir, rlvr_cli):
    proc = rlvr_cli(
        "train",
        f"model.path={tiny_model_dir}",
        "rollout.prompts_per_step=1",
        "rollout.group_size=4",
        "optim.micro_batch_size=16",
        "rollout.max_new_tokens=4",
        "steps=1",
        "eval_before_after=false",
        "report_to=[]",
        "threads=1",
        "model.autocast=none",
        f"output_dir={tmp_path / 'run'}",
        env={"OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (
        "[note] optim.micro_batch_size=16 is larger than the 4 completions per step (rollout.prompts_per_step x rollout.group_size): "
        "each update runs them as one micro-batch"
    ) in proc.stdout
    assert "micro-batch 4 completions -> at most 1 forward/backward pass(es) per rank per update" in proc.stdout
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1


def test_the_plan_clamps_and_a_fitting_micro_batch_gets_no_note(make_trainer):
    t = make_trainer("rollout.prompts_per_step=2", "rollout.group_size=4", "optim.micro_batch_size=16", "optim.steps_per_generation=2")
    assert t.plan.micro_batch_size == 4 and t.plan.accumulation_steps == 1  # a minibatch of 4 per optimizer step
    assert (
        "optim.micro_batch_size=16 is larger than the 4 completions per update (a step's 8 / optim.steps_per_generation=2): "
        "each update runs them as one micro-batch"
    ) in t.warnings
    assert not any(
        "micro_batch_size" in w
        for w in check_config(load_config(None, ["rollout.prompts_per_step=2", "rollout.group_size=4", "optim.micro_batch_size=8"]))
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_shrunk_to_one_prompt_per_rank_still_validates(path):
    cfg = load_config(str(path))
    shrunk = load_config(str(path), [f"rollout.prompts_per_step={cfg.nproc}"])
    warnings = check_config(shrunk)  # raises on any error
    if cfg.optim.micro_batch_size > cfg.rollout.group_size:
        assert any(
            w.startswith(f"optim.micro_batch_size={cfg.optim.micro_batch_size} is larger than the {cfg.rollout.group_size} completions")
            for w in warnings
        ), warnings
