"""End to end through the CLI on the bundled tiny model: a reward function written for TRL 1.16
(trainer_state, log_metric, log_extra) trains unchanged, and a reward function that starts failing
on every sample stops the run with a message naming it, keeping the last good checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

TRL_REWARD = '''
def length_curriculum(completions, trainer_state, log_metric, log_extra, **kwargs):
    """Written as TRL 1.16's GRPOTrainer docs show: it reads the trainer state, logs a metric and a column."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    log_metric("curriculum/global_step", trainer_state.global_step)
    log_metric("curriculum/max_steps", trainer_state.max_steps)
    log_extra("length_bucket", ["short" if len(t) < 3 else "long" for t in texts])
    target = 2 if trainer_state.global_step < 2 else 4
    return [-abs(len(t) - target) for t in texts]
'''

BREAKS_AT_STEP_2 = """
def flaky(prompts, completions, trainer_state, **kwargs):
    if trainer_state.global_step >= 2:
        raise ValueError("grader bug: no such column")
    return [0.0] * len(completions)
"""

FAST = [
    "model.path=tiny",
    "rollout.group_size=4",
    "rollout.prompts_per_step=4",
    "rollout.max_new_tokens=4",
    "eval_before_after=false",
    "report_to=[]",
    "threads=1",
]


def _config(tmp_path: Path, source: str, fn: str) -> Path:
    (tmp_path / "my_rewards.py").write_text(source)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"rewards:\n  - fn: arithmetic\n  - fn: {tmp_path / 'my_rewards.py'}:{fn}\n")
    return cfg


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_trl_reward_function_trains_unchanged_and_its_metric_and_column_are_logged(tmp_path, rlvr_cli):
    out = tmp_path / "run"
    rlvr_cli(
        "train",
        _config(tmp_path, TRL_REWARD, "length_curriculum"),
        *FAST,
        "steps=3",
        "log_completions_every=1",
        f"output_dir={out}",
        check=True,
        timeout=300,
    )
    metrics = _jsonl(out / "metrics.jsonl")
    assert [m["curriculum/global_step"] for m in metrics] == [0.0, 1.0, 2.0]  # the steps done before each batch
    assert [m["curriculum/max_steps"] for m in metrics] == [3.0, 3.0, 3.0]
    assert [m["rewards/length_curriculum/error_rate"] for m in metrics] == [0.0, 0.0, 0.0]
    samples = _jsonl(out / "samples.jsonl")
    assert len(samples) == 3 * 8
    for s in samples:  # the logged column sits beside the completion it describes
        assert s["length_bucket"] == ("short" if len(s["completion"]) < 3 else "long")
    rlvr_cli("report", out, check=True, timeout=300)
    html = (out / "report" / "report.html").read_text()
    assert "<th>length_bucket</th>" in html and "No reward function failed." in html


def test_a_reward_failing_on_every_sample_stops_the_run_naming_it(tmp_path, rlvr_cli):
    out = tmp_path / "run"
    proc = rlvr_cli(
        "train",
        _config(tmp_path, BREAKS_AT_STEP_2, "flaky"),
        *FAST,
        "steps=20",
        "save_every=1",
        "keep_checkpoints=2",
        "max_failed_reward_steps=2",
        "log_completions_every=0",
        f"output_dir={out}",
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    message = proc.stderr.strip().splitlines()[-1]
    assert "reward function 'flaky' failed on every sample for 2 steps in a row (max_failed_reward_steps=2)" in message
    assert "ValueError: grader bug: no such column (at " in message and "my_rewards.py:4 in flaky" in message
    assert f"Last good checkpoint: {out / 'checkpoints' / 'step-0000002'}" in message
    assert "Traceback" not in proc.stderr.split("rlvr: training stopped")[-1]  # a message, not a crash
    metrics = _jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]  # the failing steps are on record for `rlvr doctor`
    assert [m["rewards/flaky/error_rate"] for m in metrics] == [0.0, 0.0, 1.0, 1.0]
    assert [m["rewards/flaky/errors"] for m in metrics] == [0, 0, 16, 16]
    assert [m["rewards/arithmetic_correct/errors"] for m in metrics] == [0, 0, 0, 0]
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == ["step-0000001", "step-0000002"]  # nothing saved while the reward was broken; step 2 intact
    assert not (out / "final").exists()
    rlvr_cli("report", out, check=True, timeout=300)
    html = (out / "report" / "report.html").read_text()
    assert "<td>flaky</td><td class=num>32</td><td class=num>2 of 4</td><td class=num>100.0%</td>" in html
    doctor = rlvr_cli("doctor", out, "--json", timeout=120)  # the doctor names the failing function first
    findings = json.loads(doctor.stdout)["findings"]
    assert doctor.returncode == 1 and findings[0]["rule"] == "reward_failing" and "flaky" in findings[0]["message"]
