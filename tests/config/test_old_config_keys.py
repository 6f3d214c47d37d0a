"""The top-level keys grouped into eval, checkpoint and logging: a config.yaml written before (tests/fixtures/
config_before_grouping.yaml, written by rlvr before the move) loads as the new keys, old names still work as
overrides, and a run folder holding that config.yaml resumes; new runs write the new names."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from rlvr.config import ConfigError, load_config, to_dict, upgrade
from _paths import TESTS

OLD = TESTS / "fixtures" / "config_before_grouping.yaml"
MOVED = (
    "eval_before_after",
    "eval_every",
    "save_every",
    "keep_checkpoints",
    "log_completions_every",
    "num_completions_logged",
    "report_to",
    "doctor_every",
)


def test_a_config_yaml_written_before_the_grouping_loads_as_the_new_keys():
    saved = yaml.safe_load(OLD.read_text())
    assert set(MOVED) <= set(saved) and "checkpoint" not in saved  # the file really is in the old layout
    cfg = load_config(OLD)
    assert (cfg.eval.before_after, cfg.eval.every, cfg.checkpoint.every, cfg.checkpoint.keep) == (False, 1, 1, 3)
    lg = cfg.logging
    assert (lg.completions_every, lg.num_completions, lg.report_to, lg.doctor_every) == (1, 2, [], 5)
    assert (cfg.data.task, cfg.tools.functions, cfg.tools.describe, cfg.steps) == ("multiplication", ["calculator"], False, 1)
    written = to_dict(cfg)
    assert not set(MOVED) & set(written) and (written["checkpoint"]["every"], written["checkpoint"]["keep"]) == (1, 3)
    assert upgrade(saved) == _restricted(written, upgrade(saved))  # nothing else moved or changed (keys added since: defaults)


def _restricted(d: dict, like: dict) -> dict:
    """`d` with only the keys `like` has, at every depth."""
    return {k: _restricted(d[k], v) if isinstance(v, dict) and isinstance(d[k], dict) else d[k] for k, v in like.items() if k in d}


def test_old_names_work_as_overrides_and_a_conflict_is_refused(tmp_path):
    cfg = load_config(
        None,
        [
            "save_every=4",
            "keep_checkpoints=1",
            "eval_every=3",
            "report_to=[wandb]",
            "report_to.0=trackio",
            "doctor_every=0",
            "log_completions_every=2",
            "num_completions_logged=3",
            "eval_before_after=false",
        ],
    )
    assert (cfg.checkpoint.every, cfg.checkpoint.keep, cfg.eval.every, cfg.eval.before_after) == (4, 1, 3, False)
    assert (cfg.logging.report_to, cfg.logging.doctor_every, cfg.logging.completions_every, cfg.logging.num_completions) == (
        ["trackio"],
        0,
        2,
        3,
    )
    assert load_config(None, ["checkpoint.every=2", "save_every=5"]).checkpoint.every == 5  # later ones win, whatever the name
    both = tmp_path / "both.yaml"
    both.write_text("save_every: 5\ncheckpoint:\n  every: 3\n")
    with pytest.raises(
        ConfigError,
        match=rf"`save_every` \(the old name of `checkpoint.every`\) and `checkpoint.every` are both "
        rf"set in {both}, to 5 and 3: keep `checkpoint.every`",
    ):
        load_config(both)
    both.write_text("save_every: 3\ncheckpoint:\n  every: 3\n")
    assert load_config(both).checkpoint.every == 3
    with pytest.raises(ConfigError, match=r"unknown config key `save_steps` in the command line: .*`checkpoint.every`"):
        load_config(None, ["save_steps=10"])  # TRL's name points at the new key


def test_help_config_lists_the_old_names(rlvr_cli):
    out = rlvr_cli("train", "--help-config", timeout=60, check=True).stdout
    assert "checkpoint.every = 0\n" in out and "\nsave_every = " not in out.split("Old names")[0]
    old = out.split("Old names, still accepted (in config files and key=value overrides) as their place now:\n", 1)[1]
    assert old.startswith("eval_before_after = eval.before_after\neval_every = eval.every\nsave_every = checkpoint.every\n")


def test_a_run_folder_written_before_the_grouping_resumes(tmp_path, rlvr_cli):
    """The run's config.yaml and its checkpoint's are the old file: --resume reads both, finds no change of the math,
    and trains on with the old settings (checked by their effects), writing config.yaml with the new names."""
    run = tmp_path / "run"
    env = {"OMP_NUM_THREADS": "1"}
    rlvr_cli("train", OLD, f"output_dir={run}", env=env, timeout=300, check=True)  # step 1 and its checkpoint
    for where in (run, run / "checkpoints" / "step-0000001"):
        shutil.copy(OLD, where / "config.yaml")
    proc = rlvr_cli("train", "--resume", run, "steps=3", "keep_checkpoints=1", env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all("eval/reward" in m for m in metrics)  # eval_every=1
    assert sorted({json.loads(line)["step"] for line in (run / "samples.jsonl").read_text().splitlines()}) == [1, 2, 3]
    assert [p.name for p in sorted((run / "checkpoints").glob("step-*"))] == ["step-0000003"]  # keep_checkpoints=1 (an override)
    assert "eval_before" not in json.loads((run / "summary.json").read_text())  # eval_before_after=false
    written = yaml.safe_load((run / "config.yaml").read_text())
    assert not set(MOVED) & set(written)
    assert (written["checkpoint"]["every"], written["checkpoint"]["keep"]) == (1, 1) and written["eval"]["every"] == 1
    assert written["logging"] == {"completions_every": 1, "num_completions": 2, "report_to": [], "doctor_every": 5}
