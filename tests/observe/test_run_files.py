"""One reader of a run folder's files (rlvr.observe.run_files) for the doctor and the report: torn last lines
skipped, re-logged steps counted once, a damaged summary read as none."""

from __future__ import annotations

import json

import pytest

from rlvr.observe.run_files import read_config, read_metrics, read_samples, read_summary


def _run_killed_mid_write(tmp_path):
    """A run resumed from step 1 (step 2 logged twice) and killed while writing step 3 and a sample."""
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.2}, {"step": 2, "reward": 0.25}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines) + '{"step": 3, "rew')
    (run / "samples.jsonl").write_text(json.dumps({"step": 1, "completion": "42"}) + "\n" + '{"step": 2, "compl')
    (run / "summary.json").write_text('{"steps": ')
    (run / "config.yaml").write_text("steps: 3\nseed: 0\n")
    return run


def test_torn_lines_are_skipped_and_a_relogged_step_counts_once(tmp_path):
    run = _run_killed_mid_write(tmp_path)
    assert read_metrics(run) == [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.25}]
    assert read_samples(run) == [{"step": 1, "completion": "42"}]
    assert read_summary(run) == {} and read_config(run) == {"steps": 3, "seed": 0}
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        read_metrics(tmp_path)
    assert read_samples(tmp_path) == [] and read_summary(tmp_path) == {} and read_config(tmp_path) == {}


def test_the_doctor_and_the_report_read_the_same_run(tmp_path):
    from rlvr.observe.doctor import diagnose_run
    from rlvr.observe.report import load_run

    run = _run_killed_mid_write(tmp_path)
    loaded = load_run(run)
    assert (loaded.metrics, loaded.samples, loaded.summary, loaded.config) == (read_metrics(run), read_samples(run), {}, read_config(run))
    assert diagnose_run(run) == []  # two healthy steps: nothing to say, and no error on the torn lines
