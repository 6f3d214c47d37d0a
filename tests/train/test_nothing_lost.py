"""Nothing a run wrote is lost or silently rewritten: resuming a finished run, --force, torn logs, Ctrl-C.

The end of every run is a checkpoint, so `--resume RUN steps=N` either continues from the end (N larger)
or changes nothing (N equal); it never undoes steps. Whatever --force or a recovery replaces is kept
in a sibling folder.
"""

import hashlib
import json
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.training.checkpoint import complete_checkpoints, latest_checkpoint
from rlvr.training.run_control import AbandonStep, StopAtOnce, StopRequest

FAST = [
    "model.path=tiny",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=8",
    "eval_before_after=false",
    "optim.lr=1e-3",
    "log_completions_every=0",
    "threads=1",
    "report_to=[]",
]


def _tree(folder: Path) -> dict[str, str]:
    """relative path -> md5 of every file under `folder`."""
    return {str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _same_weights(a: Path, b: Path) -> bool:
    w1, w2 = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)


def _siblings(run: Path, what: str) -> list[Path]:
    return sorted(run.parent.glob(f"{run.name}.{what}-*"))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, rlvr_cli):
    """An 8-step run with save_every=3: checkpoints at 3 and 6, and (the end) 8."""
    run = tmp_path_factory.mktemp("finished") / "run"
    rlvr_cli("train", *FAST, "steps=8", "save_every=3", "keep_checkpoints=5", f"output_dir={run}", check=True, timeout=300)
    return run


def test_the_end_of_a_run_is_a_checkpoint(finished):
    assert [p.name for p in complete_checkpoints(finished / "checkpoints")] == ["step-0000003", "step-0000006", "step-0000008"]
    assert json.loads((finished / "summary.json").read_text())["steps"] == 8


def test_resuming_a_finished_run_at_its_steps_changes_nothing(finished, rlvr_cli):
    before = _tree(finished)
    done = rlvr_cli("train", "--resume", finished, "steps=8", timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{finished} finished at step 8: nothing to do, nothing changed" in done.stdout
    assert _tree(finished) == before  # final/, metrics.jsonl (8 lines), config.yaml, checkpoints: byte for byte
    assert len((finished / "metrics.jsonl").read_text().splitlines()) == 8


def test_resuming_never_undoes_steps(finished, rlvr_cli):
    before = _tree(finished)
    for flags in ([], ["--force"]):
        refused = rlvr_cli("train", "--resume", finished, "steps=6", *flags, timeout=180)
        assert refused.returncode == 2
        assert "steps=6: the run in" in refused.stderr and "has done 8 steps, and resuming never undoes steps" in refused.stderr
    assert _tree(finished) == before
    assert not _siblings(finished, "replaced") and not _siblings(finished, "rewound")


def test_a_finished_run_continues_from_its_end_like_a_straight_run(tmp_path, rlvr_cli):
    """A run that ended at step 6, continued to 20, then to 25: each continuation appends to what was logged
    (untouched), and the weights equal a straight 25-step run's bit for bit."""
    run, straight = tmp_path / "run", tmp_path / "straight"
    rlvr_cli("train", *FAST, "steps=6", f"output_dir={run}", timeout=300, check=True)
    rlvr_cli("train", "--resume", run, "steps=20", timeout=300, check=True)
    twenty, final_20 = (run / "metrics.jsonl").read_text(), _tree(run / "final")
    assert _steps(run) == list(range(1, 21))
    rlvr_cli("train", "--resume", run, "steps=25", timeout=300, check=True)
    assert (run / "metrics.jsonl").read_text().startswith(twenty)  # nothing before the end was cut or rewritten
    assert _steps(run) == list(range(1, 26))
    assert not _siblings(run, "rewound") and not _siblings(run, "replaced")
    assert _tree(run / "final") != final_20
    assert json.loads((run / "summary.json").read_text())["steps"] == 25
    rlvr_cli("train", *FAST, "steps=25", f"output_dir={straight}", timeout=300, check=True)
    assert _same_weights(run / "final", straight / "final")
    assert _metrics(straight) == _metrics(run)


def test_an_old_finished_run_with_an_older_checkpoint_needs_force(tmp_path, rlvr_cli):
    """A run finished before every run's end was a checkpoint: continuing it recomputes its last steps and
    replaces final/, so it is refused; with --force the replaced files are kept beside it."""
    run = tmp_path / "old"
    rlvr_cli("train", *FAST, "steps=5", "save_every=3", f"output_dir={run}", check=True, timeout=300)
    import shutil

    shutil.rmtree(run / "checkpoints" / "step-0000005")  # as an older rlvr left it
    summary = json.loads((run / "summary.json").read_text())
    del summary["steps"]
    (run / "summary.json").write_text(json.dumps(summary))
    before = _tree(run)
    refused = rlvr_cli("train", "--resume", run, "steps=7", timeout=180)
    assert refused.returncode == 2
    assert "finished at step 5 but its newest checkpoint is step 3" in refused.stderr
    assert "recompute steps 4-5 and replace final/. Pass --force" in refused.stderr
    assert _tree(run) == before
    forced = rlvr_cli("train", "--resume", run, "steps=7", "--force", timeout=300)
    assert forced.returncode == 0, forced.stderr[-2000:]
    kept = _siblings(run, "replaced")
    assert len(kept) == 1
    assert _tree(kept[0] / "final") == {k[len("final/") :]: v for k, v in before.items() if k.startswith("final/")}
    assert _tree(kept[0])["metrics.jsonl"] == before["metrics.jsonl"]
    assert f"the files as they were are kept in {kept[0]}" in forced.stdout
    assert _steps(run) == [1, 2, 3, 4, 5, 6, 7]


def test_force_keeps_the_whole_old_run(tmp_path, rlvr_cli):
    run = tmp_path / "run"
    rlvr_cli("train", *FAST, "steps=2", f"output_dir={run}", check=True, timeout=300)
    before = _tree(run)
    rlvr_cli("train", *FAST, "steps=1", "seed=3", f"output_dir={run}", "--force", check=True, timeout=300)
    kept = _siblings(run, "replaced")
    assert len(kept) == 1 and _tree(kept[0]) == before
    assert _steps(run) == [1]


def test_a_torn_last_log_line_does_not_stop_a_resume(tmp_path, rlvr_cli):
    """A kill mid-append leaves half a JSON line; the resume skips it (a copy of the logs is kept) and goes on."""
    run = tmp_path / "run"
    rlvr_cli("train", *FAST, "steps=4", "save_every=2", f"output_dir={run}", check=True, timeout=300)
    import shutil

    shutil.rmtree(run / "final")
    (run / "summary.json").unlink()
    shutil.rmtree(run / "checkpoints" / "step-0000004")
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 5, "loss": 0.1')  # torn
    resumed = rlvr_cli("train", "--resume", run, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _steps(run) == [1, 2, 3, 4]
    kept = _siblings(run, "rewound")
    assert len(kept) == 1 and (kept[0] / "metrics.jsonl").read_text().endswith('{"step": 5, "loss": 0.1')
    assert "steps 3-4 were logged after checkpoint step 2 and are done again" in resumed.stdout


# ---------------------------------------------------------------------------------------- stop signals

SLOW_REWARD = '''
import os, signal, time
from rlvr.tasks.arithmetic import arithmetic_correct

calls = 0

def slow(prompts, completions, answer, **kwargs):
    """Step 2's reward takes {sleep} s (a slow verifier); with SIGNAL_SELF=N it sends this process N SIGINTs."""
    global calls
    calls += 1
    if calls == 2:
        for _ in range(int(os.environ.get("SIGNAL_SELF", "0"))):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # one at a time: signals arriving together are handled once
        time.sleep({sleep})
    return arithmetic_correct(prompts, completions, answer)
'''


def _slow_reward(tmp_path: Path, sleep: float) -> str:
    path = tmp_path / "slow_reward.py"
    path.write_text(SLOW_REWARD.replace("{sleep}", str(sleep)))
    return f"rewards=[{path}:slow]"


def test_two_sigints_in_generation_abandon_the_step_and_resume_exactly(tmp_path, make_trainer, monkeypatch):
    """The second SIGINT arrives while step 2 is being scored: the step is dropped, step 1 checkpointed, and the
    resumed run equals a straight one bit for bit (the prompt position and RNG went back to the step's start)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    make_trainer(*FAST, _slow_reward(tmp_path / "a", 0), "steps=3", run="straight").train()
    monkeypatch.setenv("SIGNAL_SELF", "2")
    reward = _slow_reward(tmp_path / "b", 0)  # a module of its own: its call counter starts again
    summary = make_trainer(*FAST, reward, "steps=3", run="stopped").train()
    assert summary["interrupted_at"] == 1
    assert latest_checkpoint(tmp_path / "stopped" / "checkpoints").name == "step-0000001"
    assert _steps(tmp_path / "stopped") == [1]
    monkeypatch.setenv("SIGNAL_SELF", "0")
    make_trainer(*FAST, reward, "steps=3", "resume=auto", run="stopped").train()
    assert _same_weights(tmp_path / "straight" / "final", tmp_path / "stopped" / "final")
    assert _metrics(tmp_path / "straight") == _metrics(tmp_path / "stopped")


def test_ctrl_c_says_so_at_once_and_twice_leaves_a_checkpoint_without_traceback(tmp_path, rlvr_cli):
    run, err = tmp_path / "run", tmp_path / "stderr.txt"
    with err.open("w") as fh:
        proc = rlvr_cli.popen("train", *FAST, _slow_reward(tmp_path, 8), "steps=50", f"output_dir={run}", stderr=fh)
        deadline = time.time() + 180
        while time.time() < deadline and not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text()):
            time.sleep(0.1)
        time.sleep(1.0)  # inside step 2's slow reward
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        first = err.read_text()
        assert proc.poll() is None  # still finishing the step ...
        assert "[stop] SIGINT: finishing step 2 (generation), then writing a checkpoint and exiting; SIGINT again to stop sooner" in first
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    text = err.read_text()
    assert proc.returncode == 0, text[-2000:]
    assert "Traceback" not in text
    assert "[stop] second SIGINT: abandoning step 2's generation; checkpointing step 1 and exiting" in text
    assert latest_checkpoint(run / "checkpoints").name == "step-0000001"
    resumed = rlvr_cli("train", "--resume", run, "steps=2", timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _steps(run) == [1, 2]


def test_a_second_signal_during_the_update_waits_and_a_third_exits_at_once(capfd):
    stop = StopRequest()
    try:
        stop.at(4, "update")
        stop._handle(signal.SIGINT, None)
        assert stop.requested == "SIGINT"
        stop._handle(signal.SIGINT, None)  # not abandonable: no exception, a message
        with pytest.raises(StopAtOnce):
            stop._handle(signal.SIGINT, None)
    finally:
        stop.restore()
    err = capfd.readouterr().err
    assert "[stop] second SIGINT: step 4's update must finish for a consistent checkpoint" in err
    assert "[stop] SIGINT again: exiting at once" in err
    stop = StopRequest()
    try:
        stop.at(2, "evaluation", abandonable=True)
        stop._handle(signal.SIGTERM, None)
        with pytest.raises(AbandonStep):
            stop._handle(signal.SIGTERM, None)
    finally:
        stop.restore()


def test_a_run_written_before_a_field_existed_resumes_as_it_ran(tmp_path, rlvr_cli):
    """A tools run whose config.yaml predates `tools.describe` ran without the description: it resumes so,
    instead of being refused as a change of the math or silently starting to describe its tools."""
    import yaml

    run = tmp_path / "run"
    small = [
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=24",
        "eval_before_after=false",
        "threads=1",
        "report_to=[]",
        "log_completions_every=0",
    ]
    rlvr_cli("train", "examples/tools-calculator.yaml", *small, "steps=1", f"output_dir={run}", check=True, timeout=300)
    for path in [run / "config.yaml", *run.glob("checkpoints/step-*/config.yaml")]:
        cfg = yaml.safe_load(path.read_text())
        del cfg["tools"]["describe"]  # as the run's files were written before the field existed
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    resumed = rlvr_cli("train", "--resume", run, "steps=2", timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert yaml.safe_load((run / "config.yaml").read_text())["tools"]["describe"] is False
    assert _steps(run) == [1, 2]
