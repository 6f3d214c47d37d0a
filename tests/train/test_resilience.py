"""Nothing lost: exact resume, a skipped non-finite step, a clean stop on SIGTERM."""

import json
import signal
import time

import pytest
import torch
from safetensors.torch import load_file

from rlvr import algo
from rlvr.config import ConfigError
from rlvr.training import TrainingError
from rlvr.training.checkpoint import latest_checkpoint

# The bundled model (it solves some problems: real signal) on 4 prompts x 4 completions of 8 tokens.
FAST = [
    "model.path=tiny",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=8",
    "eval_before_after=false",
    "optim.lr=1e-3",
    "log_completions_every=0",
]


def _metrics(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _weights(path):
    return load_file(str(path / "model.safetensors"))


def test_resume_matches_an_uninterrupted_run(make_trainer, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    make_trainer(*FAST, "steps=6", run="straight").train()

    first = make_trainer(*FAST, "steps=6", run="resumed")
    for _ in range(3):
        first.train_step()
    first.save_checkpoint()  # what save_every=3 does at step 3; then the process is gone
    del first
    again = make_trainer(*FAST, "steps=6", "resume=auto", run="resumed")
    assert again.state.step == 3 and again.stream.position == 3 * 4
    again.train()

    w1, w2 = _weights(straight / "final"), _weights(resumed / "final")
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)  # bitwise
    assert _metrics(straight)[3:] == _metrics(resumed)  # steps 4-6, every value


def test_resume_auto_without_checkpoint_starts_fresh(make_trainer):
    t = make_trainer(*FAST, "steps=2", "resume=auto")
    assert t.state.step == 0 and t.resumed_from is None


def test_non_finite_loss_skips_the_update(make_trainer, monkeypatch):
    real = algo.policy_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        out = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:  # the second step's (only) micro-batch
            return out._replace(loss=out.loss * float("inf"))
        return out

    # every step must reach policy_loss, even one whose groups all tie (those rows are skipped by default)
    t = make_trainer(*FAST, "steps=3", "optim.skip_zero_advantage=false")
    t.train_step()
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    opt_before = json.dumps({k: str(v["step"]) for k, v in t.optimizer.state_dict()["state"].items()})
    monkeypatch.setattr(algo, "policy_loss", poisoned)
    calls["n"] = 1
    m = t.train_step()
    assert m["skipped_steps"] == 1 and t.state.skipped_steps == 1 and t.state.bad_steps_in_a_row == 1
    assert all(torch.equal(before[k], v) for k, v in t.model.state_dict().items())
    assert json.dumps({k: str(v["step"]) for k, v in t.optimizer.state_dict()["state"].items()}) == opt_before
    m = t.train_step()
    assert m["skipped_steps"] == 1 and t.state.bad_steps_in_a_row == 0
    assert any(not torch.equal(before[k], v) for k, v in t.model.state_dict().items())


def test_repeated_non_finite_steps_stop_the_run(make_trainer, tmp_path, monkeypatch):
    real = algo.policy_loss
    monkeypatch.setattr(algo, "policy_loss", lambda *a, **k: (lambda o: o._replace(loss=o.loss * float("nan")))(real(*a, **k)))
    t = make_trainer(*FAST, "steps=10", "max_bad_steps=2", "optim.skip_zero_advantage=false", run="r")
    with pytest.raises(TrainingError, match="2 steps in a row"):
        t.train()
    assert not (tmp_path / "r" / "final").exists()


def test_sigterm_saves_a_checkpoint_and_exits_zero(tmp_path, rlvr_cli):
    out = tmp_path / "run"
    proc = rlvr_cli.popen("train", "steps=100000", f"output_dir={out}", *FAST)
    deadline = time.time() + 180  # a loaded 2-core machine takes long to start
    while time.time() < deadline and not (out / "metrics.jsonl").exists():
        time.sleep(0.2)
    while time.time() < deadline and len((out / "metrics.jsonl").read_text().splitlines()) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    assert f"Resume with: rlvr train --resume {out}" in stdout
    assert "final model" not in stdout and not (out / "final").exists()  # no line about a model that was not written
    ckpt = latest_checkpoint(out / "checkpoints")
    assert ckpt is not None
    steps = len((out / "metrics.jsonl").read_text().splitlines())
    assert ckpt.name == f"step-{steps:07d}"


def _wait_for(predicate, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_kill_9_then_resume_gives_the_uninterrupted_result(tmp_path, rlvr_cli):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    common = ["train", *FAST, "steps=12", "save_every=3", "keep_checkpoints=10", "threads=1"]
    assert rlvr_cli(*common, f"output_dir={straight}", timeout=180).returncode == 0
    proc = rlvr_cli.popen(*common, f"output_dir={killed}")
    assert _wait_for(lambda: latest_checkpoint(killed / "checkpoints") is not None)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = rlvr_cli(*common, f"output_dir={killed}", "resume=auto", timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    w1, w2 = _weights(straight / "final"), _weights(killed / "final")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert _metrics(straight) == _metrics(killed)  # every step once, every value identical


def test_kill_9_during_a_checkpoint_write_keeps_the_previous_one(tmp_path, rlvr_cli):
    out, marker = tmp_path / "run", tmp_path / "paused"
    common = ["train", *FAST, "steps=6", "save_every=2", f"output_dir={out}", "threads=1"]
    proc = rlvr_cli.popen(*common, env={"RLVR_TEST_PAUSE_BEFORE_RENAME": f"4:{marker}"})
    assert _wait_for(marker.exists)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpts = out / "checkpoints"
    assert latest_checkpoint(ckpts).name == "step-0000002"
    assert (ckpts / ".tmp-step-0000004").exists()  # the half-written one never became a checkpoint
    resumed = rlvr_cli(*common, "resume=auto", timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not (ckpts / ".tmp-step-0000004").exists()
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5, 6]


def test_resume_refuses_a_config_that_changes_the_math(make_trainer):
    t = make_trainer(*FAST, "steps=2")
    t.train_step()
    t.save_checkpoint()

    with pytest.raises(ConfigError, match=r"algo.epsilon: 0.2 -> 0.3"):
        make_trainer(*FAST, "steps=2", "resume=auto", "algo.epsilon=0.3")
    forced = make_trainer(*FAST, "steps=2", "resume=auto", "algo.epsilon=0.3", force=True)
    assert forced.state.step == 1
    more = make_trainer(*FAST, "steps=5", "resume=auto")
    assert more.state.step == 1  # more steps is not a change of the math


def test_resume_is_exact_with_dynamic_sampling(make_trainer, tmp_path):
    """Dynamic sampling consumes a data-dependent number of prompts; the saved stream position
    alone must put a resumed run back on the same prompts."""
    ds = FAST + ["algo.dynamic_sampling=true", "algo.max_resample_rounds=3"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    make_trainer(*ds, "steps=4", run="straight").train()
    first = make_trainer(*ds, "steps=4", run="resumed")
    for _ in range(2):
        first.train_step()
    first.save_checkpoint()
    position = first.stream.position
    del first
    again = make_trainer(*ds, "steps=4", "resume=auto", run="resumed")
    assert again.stream.position == position
    again.train()
    straight_metrics = _metrics(straight)
    assert any(m["sampling/rounds"] > 1 for m in straight_metrics)  # resampling really happened
    assert straight_metrics[2:] == _metrics(resumed)
    w1, w2 = _weights(straight / "final"), _weights(resumed / "final")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_force_in_a_used_folder_starts_the_logs_over(make_trainer, tmp_path):
    """--force in a folder that holds a run starts over: metrics.jsonl then holds the new run's
    steps only (it used to append them to the old run's, so step 1 appeared twice)."""
    first = make_trainer(*FAST, "steps=3")
    first.train()
    with pytest.raises(ConfigError, match="already holds a run"):  # not without --force
        make_trainer(*FAST, "steps=2", "seed=1")
    second = make_trainer(*FAST, "steps=2", "seed=1", force=True)
    second.train()
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
