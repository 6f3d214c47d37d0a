"""`rlvr eval` evaluates a run the way it trained: the run's folder, final/ or a checkpoint, with the
run's config (tools, tool format, prompt column, system prompt, eval.data, max_new_tokens), so the
number equals the run's own held-out score; tool tasks and any model take the same tool options."""

from __future__ import annotations

import json
import shutil

import pytest

from _calc_caller import save_calc_caller, write_rows
from rlvr.cli import main

FAST = ["rollout.group_size=4", "rollout.prompts_per_step=2", "threads=1", "report_to=[]", "model.autocast=none"]
# the caller learnt the bare tags: no description of the tools in its prompts (its context is 256 positions)
TOOLS = [
    "rewards=[final_answer]",
    "tools.functions=[calculator]",
    "tools.tags=[calculator=calc]",
    "tools.format=tags",
    "tools.describe=false",
]


@pytest.fixture(scope="module")
def caller(tmp_path_factory):
    return save_calc_caller(tmp_path_factory.mktemp("calc_caller"))


@pytest.fixture(scope="module")
def tools_run(caller, tmp_path_factory, rlvr_cli):
    """A finished run with the calculator: prompts in a `question` column, 5 held-out rows of which the
    caller (always 408) gets 3 right, evaluated at step 1 (checkpointed there) and after training."""
    where = tmp_path_factory.mktemp("tools_run")
    train = write_rows(where / "train.jsonl", ["408"] * 4, "question")
    held = write_rows(where / "held.jsonl", ["408"] * 3 + ["999"] * 2, "question")
    run = where / "run"
    rlvr_cli(
        "train",
        f"output_dir={run}",
        f"model.path={caller}",
        f"data.path={train}",
        "data.prompt_column=question",
        f"eval.data={held}",
        *TOOLS,
        "rollout.max_new_tokens=64",
        "steps=2",
        "eval_every=1",
        "save_every=1",
        *FAST,
        check=True,
        timeout=300,
    )
    return run, held


def rlvr(capsys, *args) -> tuple[int, str, str]:
    """`rlvr ARGS` in this process (the model loads in a second, not the five of a fresh interpreter): (status, stdout, stderr)."""
    capsys.readouterr()
    status = main([str(a) for a in args])
    out = capsys.readouterr()
    return status, out.out, out.err


def _score_line(held, score: str) -> str:
    return f"{held} held-out mean final_answer (5 rows, greedy): {score}"


def test_a_tools_run_its_final_and_its_checkpoint_score_as_the_run_did(tools_run, rlvr_cli, capsys):
    run, held = tools_run
    summary = json.loads((run / "summary.json").read_text())
    at_step_1 = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["eval/reward"]
    assert summary["eval_after"] == at_step_1 == 0.6  # 3 of 5: the calculator's 408 is right on three rows
    how = "multi-turn with tools calculator (tools.format=tags, max_turns=4)"
    proc = rlvr_cli("eval", run, check=True)  # the run's folder, as a user types it
    assert proc.stdout.splitlines() == [f"[note] evaluating {run / 'final'} with {run / 'config.yaml'}: {how}", _score_line(held, "0.600")]
    step_1 = run / "checkpoints" / "step-0000001"
    for model, config in [(run / "final", run / "config.yaml"), (step_1, step_1 / "config.yaml")]:
        assert rlvr(capsys, "eval", model)[:2] == (0, f"[note] evaluating {model} with {config}: {how}\n{_score_line(held, '0.600')}\n")
    status, out, _ = rlvr(capsys, "eval", run, "--tools", "")  # the tools switched off: nothing to copy the answer from
    assert status == 0 and f"with {run / 'config.yaml'}: single-turn" in out and _score_line(held, "0.000") in out


def test_tools_settings_of_a_run_can_be_overridden_by_their_config_keys(tools_run, capsys):
    run, held = tools_run
    status, out, _ = rlvr(capsys, "eval", run / "final", "tools.max_turns=1")  # the call is made in the last turn: not run
    assert status == 0 and "(tools.format=tags, max_turns=1)" in out and _score_line(held, "0.000") in out
    status, _, err = rlvr(capsys, "eval", run, "optim.lr=1")
    assert status == 2 and err.strip() == (
        "rlvr: error: rlvr eval: `optim.lr=1`: only tools.* settings can be overridden here (e.g. tools.timeout_s=5); "
        "the other flags set what is evaluated (rlvr eval --help)"
    )


def test_a_run_without_final_points_to_its_newest_checkpoint(tools_run, capsys, tmp_path):
    run, _ = tools_run
    unfinished = tmp_path / "unfinished"
    shutil.copytree(run, unfinished, ignore=shutil.ignore_patterns("final"))
    status, _, err = rlvr(capsys, "eval", unfinished)
    assert status == 2 and err.strip() == (
        f"rlvr: error: rlvr eval {unfinished}: the run has no final/ model (it has not finished); "
        f"evaluate its newest checkpoint: rlvr eval {unfinished / 'checkpoints' / 'step-0000002'}"
    )


def test_a_tool_task_is_evaluated_with_its_tools_and_any_model_takes_tool_flags(caller, rlvr_cli, capsys, tmp_path):
    proc = rlvr_cli("eval", caller, "--task", "multiplication", "--n", "3", "tools.describe=false", check=True)
    assert proc.stdout.splitlines() == [
        f"[note] evaluating {caller} with rlvr's defaults: multi-turn with tools calculator (tools.format=tags, max_turns=2)",
        "multiplication held-out accuracy (3 problems, greedy): 1.000",
    ]
    status, out, _ = rlvr(capsys, "eval", caller, "--task", "multiplication", "--n", "3", "--tools", "", "tools.describe=false")
    assert status == 0 and "multiplication held-out accuracy (3 problems, greedy): 0.000" in out
    held = write_rows(tmp_path / "held.jsonl", ["408", "999"])
    status, out, _ = rlvr(
        capsys,
        "eval",
        caller,
        "--data",
        held,
        "--reward",
        "final_answer",
        "--max-new-tokens",
        "64",
        "--tools",
        "calculator",
        "--tool-tags",
        "calculator=calc",
        "--tool-format",
        "tags",
        "--max-turns",
        "2",
        "tools.describe=false",
    )
    assert status == 0 and f"{held} held-out mean final_answer (2 rows, greedy): 0.500" in out
    status, _, err = rlvr(capsys, "eval", caller, "--task", "multiplication", "--tool-format", "tagz")
    assert status == 2 and "`tools.format` must be one of ['auto', 'chat_template', 'tags'], got 'tagz' (did you mean 'tags'?)" in err


def test_a_run_is_evaluated_with_its_system_prompt_and_length(rlvr_cli, capsys, tmp_path):
    run = tmp_path / "run"
    rlvr_cli(
        "train",
        f"output_dir={run}",
        "model.path=tiny",
        "data.system_prompt=Answer with the number only.",
        "data.eval_size=40",
        "rollout.max_new_tokens=3",
        "steps=1",
        *FAST,
        check=True,
        timeout=300,
    )
    after = json.loads((run / "summary.json").read_text())["eval_after"]
    status, out, _ = rlvr(capsys, "eval", run)
    assert status == 0 and f"arithmetic held-out accuracy (40 problems, greedy): {after:.3f}" in out
    status, out, _ = rlvr(capsys, "eval", run, "--system-prompt", "")  # the system prompt is what the run's number depends on
    assert status == 0 and "arithmetic held-out accuracy (40 problems, greedy): " in out
    assert f"arithmetic held-out accuracy (40 problems, greedy): {after:.3f}" not in out
