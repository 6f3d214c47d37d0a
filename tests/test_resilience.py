"""Nothing lost: exact resume, a skipped non-finite step, a clean stop on SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from rlvr import algo
from rlvr.checkpoint import latest_checkpoint
from rlvr.config import load_config
from rlvr.trainer import Trainer, TrainingError

FAST = ["rollout.prompts_per_step=4", "rollout.group_size=4", "eval_before_after=false", "optim.lr=1e-3", "log_completions_every=0"]


def _metrics(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _weights(path):
    return load_file(str(path / "model.safetensors"))


def test_resume_matches_an_uninterrupted_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    Trainer(load_config(None, FAST + ["steps=6", f"output_dir={straight}"]), logger_live=False).train()

    first = Trainer(load_config(None, FAST + ["steps=6", f"output_dir={resumed}"]), logger_live=False)
    for _ in range(3):
        first.train_step()
    first.save_checkpoint()  # what save_every=3 does at step 3; then the process is gone
    del first
    again = Trainer(load_config(None, FAST + ["steps=6", f"output_dir={resumed}", "resume=auto"]), logger_live=False)
    assert again.step == 3 and again.stream.position == 3 * 4
    again.train()

    w1, w2 = _weights(straight / "final"), _weights(resumed / "final")
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)  # bitwise
    assert _metrics(straight)[3:] == _metrics(resumed)  # steps 4-6, every value


def test_resume_auto_without_checkpoint_starts_fresh(tmp_path):
    t = Trainer(load_config(None, FAST + ["steps=2", f"output_dir={tmp_path}", "resume=auto"]), logger_live=False)
    assert t.step == 0


def test_non_finite_loss_skips_the_update(tmp_path, monkeypatch):
    real = algo.policy_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        out = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:  # the second step's (only) micro-batch
            return out._replace(loss=out.loss * float("inf"))
        return out

    # every step must reach policy_loss, even one whose groups all tie (those rows are skipped by default)
    t = Trainer(load_config(None, FAST + ["steps=3", f"output_dir={tmp_path / 'r'}", "optim.skip_zero_advantage=false"]), logger_live=False)
    t.train_step()
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    opt_before = json.dumps({k: str(v["step"]) for k, v in t.optimizer.state_dict()["state"].items()})
    monkeypatch.setattr(algo, "policy_loss", poisoned)
    calls["n"] = 1
    m = t.train_step()
    assert m["skipped_steps"] == 1
    assert all(torch.equal(before[k], v) for k, v in t.model.state_dict().items())
    assert json.dumps({k: str(v["step"]) for k, v in t.optimizer.state_dict()["state"].items()}) == opt_before
    m = t.train_step()
    assert m["skipped_steps"] == 1 and t.bad_steps_in_a_row == 0
    assert any(not torch.equal(before[k], v) for k, v in t.model.state_dict().items())


def test_repeated_non_finite_steps_stop_the_run(tmp_path, monkeypatch):
    real = algo.policy_loss
    monkeypatch.setattr(algo, "policy_loss", lambda *a, **k: (lambda o: o._replace(loss=o.loss * float("nan")))(real(*a, **k)))
    t = Trainer(load_config(None, FAST + ["steps=10", "max_bad_steps=2", f"output_dir={tmp_path / 'r'}", "optim.skip_zero_advantage=false"]),
                logger_live=False)
    with pytest.raises(TrainingError, match="2 steps in a row"):
        t.train()
    assert not (tmp_path / "r" / "final").exists()


def test_sigterm_saves_a_checkpoint_and_exits_zero(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlvr", "train", "steps=100000", f"output_dir={out}", *FAST]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not (out / "metrics.jsonl").exists():
        time.sleep(0.2)
    while time.time() < deadline and len((out / "metrics.jsonl").read_text().splitlines()) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    assert "resume=auto" in stdout
    ckpt = latest_checkpoint(out / "checkpoints")
    assert ckpt is not None
    steps = len((out / "metrics.jsonl").read_text().splitlines())
    assert ckpt.name == f"step-{steps:07d}"


def _run_cli(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "rlvr", "train", *FAST, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _wait_for(predicate, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_kill_9_then_resume_gives_the_uninterrupted_result(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    common = ["steps=12", "save_every=3", "keep_checkpoints=10", "threads=1"]
    assert _run_cli([*common, f"output_dir={straight}"]).wait(timeout=180) == 0
    proc = _run_cli([*common, f"output_dir={killed}"])
    assert _wait_for(lambda: latest_checkpoint(killed / "checkpoints") is not None)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = _run_cli([*common, f"output_dir={killed}", "resume=auto"])
    out, err = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, err[-2000:]
    w1, w2 = _weights(straight / "final"), _weights(killed / "final")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert _metrics(straight) == _metrics(killed)  # every step once, every value identical


def test_kill_9_during_a_checkpoint_write_keeps_the_previous_one(tmp_path):
    out, marker = tmp_path / "run", tmp_path / "paused"
    env = {**os.environ, "RLVR_TEST_PAUSE_BEFORE_RENAME": f"4:{marker}"}
    proc = _run_cli(["steps=6", "save_every=2", f"output_dir={out}", "threads=1"], env=env)
    assert _wait_for(marker.exists)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpts = out / "checkpoints"
    assert latest_checkpoint(ckpts).name == "step-0000002"
    assert (ckpts / ".tmp-step-0000004").exists()  # the half-written one never became a checkpoint
    resumed = _run_cli(["steps=6", "save_every=2", f"output_dir={out}", "resume=auto", "threads=1"])
    stdout, stderr = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, stderr[-2000:]
    assert not (ckpts / ".tmp-step-0000004").exists()
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5, 6]


def test_resume_refuses_a_config_that_changes_the_math(tmp_path):
    t = Trainer(load_config(None, FAST + ["steps=2", f"output_dir={tmp_path}"]), logger_live=False)
    t.train_step()
    t.save_checkpoint()
    from rlvr.config import ConfigError

    with pytest.raises(ConfigError, match=r"algo.epsilon: 0.2 -> 0.3"):
        Trainer(load_config(None, FAST + ["steps=2", f"output_dir={tmp_path}", "resume=auto", "algo.epsilon=0.3"]), logger_live=False)
    forced = Trainer(load_config(None, FAST + ["steps=2", f"output_dir={tmp_path}", "resume=auto", "algo.epsilon=0.3"]), force=True, logger_live=False)
    assert forced.step == 1
    more = Trainer(load_config(None, FAST + ["steps=5", f"output_dir={tmp_path}", "resume=auto"]), logger_live=False)
    assert more.step == 1  # more steps is not a change of the math


def test_resume_is_exact_with_dynamic_sampling(tmp_path):
    """Dynamic sampling consumes a data-dependent number of prompts; the saved stream position
    alone must put a resumed run back on the same prompts."""
    ds = FAST + ["algo.dynamic_sampling=true", "algo.max_resample_rounds=3"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    Trainer(load_config(None, ds + ["steps=4", f"output_dir={straight}"]), logger_live=False).train()
    first = Trainer(load_config(None, ds + ["steps=4", f"output_dir={resumed}"]), logger_live=False)
    for _ in range(2):
        first.train_step()
    first.save_checkpoint()
    position = first.stream.position
    del first
    again = Trainer(load_config(None, ds + ["steps=4", f"output_dir={resumed}", "resume=auto"]), logger_live=False)
    assert again.stream.position == position
    again.train()
    straight_metrics = _metrics(straight)
    assert any(m["sampling/rounds"] > 1 for m in straight_metrics)  # resampling really happened
    assert straight_metrics[2:] == _metrics(resumed)
    w1, w2 = _weights(straight / "final"), _weights(resumed / "final")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_force_in_a_used_folder_starts_the_logs_over(tmp_path):
    """--force in a folder that holds a run starts over: metrics.jsonl then holds the new run's
    steps only (it used to append them to the old run's, so step 1 appeared twice)."""
    first = Trainer(load_config(None, FAST + ["steps=3", f"output_dir={tmp_path}"]), logger_live=False)
    first.train()
    second = Trainer(load_config(None, FAST + ["steps=2", f"output_dir={tmp_path}", "seed=1"]), force=True, logger_live=False)
    second.train()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
