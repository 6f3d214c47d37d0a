"""The seeds' common mistakes, caught at start-up (and, for prompts with no signal, after the first
steps), through the real CLI."""

import pytest
from _runs import train_cli

from rlvr.config import ConfigError, load_config
from rlvr.training.setup import check_config


def test_group_size_one_is_refused_before_anything_loads(rlvr_cli):
    proc = rlvr_cli("train", "rollout.group_size=1", "model.path=/nonexistent", timeout=60)
    assert proc.returncode == 2
    assert "rollout.group_size` must be at least 2" in proc.stderr


def test_temperature_zero_refused_unless_forced(rlvr_cli):
    proc = rlvr_cli("train", "rollout.temperature=0", "model.path=/nonexistent", timeout=60)
    assert proc.returncode == 2 and "rollout.temperature` is 0" in proc.stderr
    with pytest.raises(ConfigError):
        check_config(load_config(None, ["rollout.temperature=0"]))
    warnings = check_config(load_config(None, ["rollout.temperature=0"]), force=True)
    assert any("temperature=0 forced" in w for w in warnings)


def test_group_size_two_warns():
    warnings = check_config(load_config(None, ["rollout.group_size=2"]))
    assert any("group_size=2" in w and "+1/-1" in w for w in warnings)


@pytest.mark.parametrize(
    "beta, note", [("0", "no KL penalty (algo.beta=0): no reference model"), ("0.04", "KL penalty on (algo.beta=0.04")]
)
def test_kl_note_says_whether_a_penalty_is_on(beta, note):
    assert any(note in w for w in check_config(load_config(None, [f"algo.beta={beta}"])))


def test_report_to_and_doctor_every_are_validated():
    with pytest.raises(ConfigError, match=r"`logging.report_to` must be one of .* got 'tensorbord' \(did you mean 'tensorboard'\?\)"):
        check_config(load_config(None, ["report_to=[tensorbord]"]))
    with pytest.raises(ConfigError, match=r"`logging.doctor_every` must be >= 0 \(0: never\), got -1"):
        check_config(load_config(None, ["doctor_every=-1"]))


def test_warns_after_the_first_steps_when_every_group_is_identical(tmp_path, tiny_model_dir, rlvr_cli):
    """A random model never solves arithmetic: all groups are all-wrong, and the run says so."""
    proc = train_cli(
        rlvr_cli,
        tmp_path / "run",
        f"model.path={tiny_model_dir}",
        "steps=4",
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "eval_before_after=false",
        "log_completions_every=0",
        "report_to=[]",
    )
    lines = proc.stdout.splitlines()
    warn = next(i for i, line in enumerate(lines) if "[warning] doctor: every group had identical rewards" in line)
    assert lines[warn - 1].startswith("step 3/4"), lines[warn - 1]  # right after the third step
    assert "too hard" in lines[warn] and "algo.dynamic_sampling=true" in proc.stdout
    assert not (tmp_path / "run" / "tb").exists()  # report_to=[]: no TensorBoard
