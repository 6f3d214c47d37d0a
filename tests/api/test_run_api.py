"""rlvr's Python API: `rlvr.train` (a dict, a YAML file or a Config, with the CLI's overrides) runs what
`rlvr train` runs and returns a Run; `rlvr.evaluate` gives the score `rlvr eval` prints. Real runs of the
session's tiny random model, two steps each."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import yaml

import rlvr
from rlvr.config import Config, ConfigError, load_config

FAST = {
    "steps": 2,
    "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4},
    "eval": {"before_after": False},
    "logging": {"report_to": [], "completions_every": 0},
    "model": {"autocast": "none"},
    "threads": 1,
}


def _fast(model: str, out: Path) -> dict:
    return {**FAST, "model": {**FAST["model"], "path": model}, "output_dir": str(out)}


def _tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its content's hash: what "nothing touched" compares."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def dict_run(tiny_model_dir, tmp_path_factory):
    return rlvr.train(_fast(tiny_model_dir, tmp_path_factory.mktemp("api") / "run"), progress=False)


def test_train_with_a_dict_returns_the_run(dict_run):
    run = dict_run
    assert isinstance(run, rlvr.Run)
    assert run.summary["steps"] == 2 and run.interrupted_at is None
    assert run.final_model == run.output_dir / "final" and (run.final_model / "config.json").is_file()
    rows = run.metrics()
    assert [r["step"] for r in rows] == [1, 2] and all("reward" in r and "loss" in r for r in rows)
    text = repr(run)
    assert f"Run({run.output_dir}): 2 steps" in text and f"final model: {run.final_model}" in text


def test_train_with_a_yaml_file_and_overrides(tiny_model_dir, tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text(yaml.safe_dump({**_fast(tiny_model_dir, tmp_path / "ignored"), "steps": 5}))
    run = rlvr.train(path, "steps=2", f"output_dir={tmp_path / 'run'}", progress=False)  # overrides win, as on the command line
    assert run.output_dir == tmp_path / "run" and run.summary["steps"] == 2 and len(run.metrics()) == 2


def test_train_with_a_config_and_overrides_leaves_the_config_alone(tiny_model_dir, tmp_path):
    cfg = load_config(_fast(tiny_model_dir, tmp_path / "a"))
    assert isinstance(cfg, Config)
    run = rlvr.train(cfg, f"output_dir={tmp_path / 'b'}", "rollout.group_size=8", "steps=1", progress=False)
    assert run.output_dir == tmp_path / "b" and run.summary["steps"] == 1
    assert yaml.safe_load((run.output_dir / "config.yaml").read_text())["rollout"]["group_size"] == 8
    assert cfg.output_dir == str(tmp_path / "a") and cfg.rollout.group_size == 4 and cfg.steps == 2


def test_resuming_a_finished_run_at_its_steps_raises_and_touches_nothing(dict_run):
    from rlvr.training import RunFinished

    before = _tree(dict_run.output_dir)
    with pytest.raises(RunFinished, match="finished at step 2: nothing to do, nothing changed"):
        rlvr.train(resume=dict_run.output_dir, progress=False)
    assert _tree(dict_run.output_dir) == before


def test_resume_takes_no_other_config(dict_run):
    with pytest.raises(ConfigError, match="takes the run's own config.yaml"):
        rlvr.train({"steps": 3}, resume=dict_run.output_dir)


@pytest.mark.parametrize(
    ("config", "overrides", "message"),
    [
        ({"rollout": {"group_sise": 4}}, (), "`rollout.group_sise` in the config dict; did you mean `rollout.group_size`"),
        (None, ("optim.lrr=1e-5",), r"unknown config key `optim.lrr` in the command line; did you mean `optim.lr`"),
        (42, (), "config must be a rlvr Config, a dict, a YAML path or None, not int"),
    ],
)
def test_a_bad_key_raises_a_config_error_naming_it(config, overrides, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        rlvr.train(config, *overrides, f"output_dir={tmp_path / 'run'}")
    assert not (tmp_path / "run").exists()


def test_several_processes_need_torchrun_around_the_script(tiny_model_dir, tmp_path, monkeypatch):
    for var in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match=r"nproc=2 .*torchrun --nproc-per-node 2 script.py.*rlvr train nproc=N"):
        rlvr.train(_fast(tiny_model_dir, tmp_path / "run"), "nproc=2")
    assert not (tmp_path / "run").exists()


def test_evaluate_gives_the_score_rlvr_eval_prints(rlvr_cli):
    proc = rlvr_cli("eval", "tiny", "--task", "arithmetic", "--n", "30", check=True, timeout=180)
    printed = re.search(r"arithmetic held-out accuracy \(30 problems, greedy\): (\d\.\d{3})", proc.stdout)
    assert printed, proc.stdout
    result = rlvr.evaluate("tiny", task="arithmetic", n=30, quiet=True)
    assert f"{result.score:.3f}" == printed.group(1)
    assert (result.label, result.rows, result.samples, result.failed) == ("accuracy", 30, 1, 0)
    assert result.lines()[-1] in proc.stdout


def test_evaluate_with_samples_gives_pass_at_k(capsys):
    result = rlvr.evaluate("tiny", task="arithmetic", n=20, samples=4)
    assert capsys.readouterr().out.startswith("[note] evaluating tiny with rlvr's defaults: single-turn")
    assert list(result.pass_at) == [1, 2, 4]
    assert result.pass_at[1] <= result.pass_at[2] <= result.pass_at[4]
    assert result.avg == pytest.approx(result.score) and result.samples == 4
    assert set(result.intervals) >= {"pass@1", "pass@2", "pass@4", "avg@4"}
    low, high = result.intervals["pass@4"].low, result.intervals["pass@4"].high
    assert low <= result.pass_at[4] <= high
    assert "avg@4" in repr(result)


def test_the_api_is_exported_lazily_from_rlvr():
    import subprocess
    import sys

    from rlvr.api.run import Run

    assert rlvr.Run is Run
    # importing the training package and the evaluation module (the runs above did) leaves rlvr.train the function
    bad = "rlvr.train({'rollout': {'group_sise': 4}})"
    with pytest.raises(ConfigError, match="did you mean `rollout.group_size`"):
        eval(bad, {"rlvr": rlvr})
    fresh = (
        "import rlvr.training.trainer, rlvr.api.evaluation, rlvr; f, e = rlvr.train, rlvr.evaluate; "
        f"assert (f.__module__, e.__module__) == ('rlvr.api.run', 'rlvr.api.evaluation') and f is rlvr.api.run.train; {bad}"
    )
    proc = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, timeout=120)
    assert "ConfigError: unknown config key `rollout.group_sise`" in proc.stderr, proc.stderr[-2000:]
