"""A failed evaluation is an error, never a score: a held-out reward that fails on every row stops
`rlvr eval` (exit 1) and training (exit 1, no eval numbers written) naming the reward and its first
exception; one that fails on some rows is a warning saying how many."""

from __future__ import annotations

import json

from rlvr.cli import main

REWARDS = """
def broken(prompts, completions, **kwargs):
    raise ValueError("grader bug")


def half(prompts, completions, **kwargs):
    return [1.0 if i % 2 == 0 else "oops" for i in range(len(completions))]
"""

FAST = [
    "data.eval_size=4",
    "steps=2",
    "rollout.group_size=4",
    "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=4",
    "threads=1",
    "report_to=[]",
    "model.autocast=none",
]


def _files(tmp_path):
    (tmp_path / "bad.py").write_text(REWARDS)
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in (11, 12, 13, 14, 15)))
    return tmp_path / "bad.py", held


def test_rlvr_eval_with_a_reward_that_always_raises_exits_1_naming_it(tmp_path, rlvr_cli):
    bad, held = _files(tmp_path)
    proc = rlvr_cli("eval", "tiny", "--data", held, "--reward", f"{bad}:broken", "--max-new-tokens", "4")
    assert proc.returncode == 1 and "held-out" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == (
        f"rlvr: error: no held-out score: the reward 'broken' failed on every one of the 5 rows; "
        f"its first error: ValueError: grader bug (at {bad}:3 in broken)"
    )


def test_rlvr_eval_says_how_many_rows_a_reward_failed_on(tmp_path, capsys):
    bad, held = _files(tmp_path)
    status = main(["eval", "tiny", "--data", str(held), "--reward", f"{bad}:half", "--max-new-tokens", "4"])
    out = capsys.readouterr()
    assert status == 0 and f"{held} held-out mean half (5 rows, greedy): 0.600" in out.out  # rows 0, 2, 4 score 1
    assert (
        "rlvr: warning: the reward 'half' failed on 2 of 5 held-out rows (counted as 0); its first error: "
        "returned 'oops' (str) for completion 1; expected a finite number or None"
    ) in out.err


def test_training_stops_instead_of_recording_a_failed_evaluation(tmp_path, rlvr_cli, capsys):
    bad, _ = _files(tmp_path)
    message = (
        f"rlvr: training stopped: held-out evaluation of arithmetic: no held-out score: the reward 'broken' failed on every "
        f"one of the 4 rows; its first error: ValueError: grader bug (at {bad}:3 in broken)"
    )
    before = rlvr_cli("train", f"output_dir={tmp_path / 'before'}", f"eval.reward={bad}:broken", *FAST, timeout=300)
    assert before.returncode == 1 and before.stderr.strip().splitlines()[-1] == message
    assert not (tmp_path / "before" / "summary.json").exists() and (tmp_path / "before" / "metrics.jsonl").read_text() == ""
    capsys.readouterr()
    status = main(
        ["train", f"output_dir={tmp_path / 'during'}", f"eval.reward={bad}:broken", "eval_before_after=false", "eval_every=1", *FAST]
    )
    assert status == 1 and capsys.readouterr().err.strip().splitlines()[-1] == message  # at step 1, before it is logged
    assert not (tmp_path / "during" / "summary.json").exists() and (tmp_path / "during" / "metrics.jsonl").read_text() == ""


def test_training_warns_when_the_held_out_reward_fails_on_some_rows(make_trainer, tmp_path, capsys):
    bad, _ = _files(tmp_path)
    summary = make_trainer(f"eval.reward={bad}:half", "data.eval_size=4", "eval_before_after=true", "steps=1").train()
    assert summary["eval_before"] == summary["eval_after"] == 0.5  # rows 0 and 2 score 1, rows 1 and 3 failed
    note = (
        "the reward 'half' failed on 2 of 4 held-out rows (counted as 0); its first error: "
        "returned 'oops' (str) for completion 1; expected a finite number or None"
    )
    out = capsys.readouterr().out
    assert f"[warning] held-out evaluation before training: {note}" in out
    assert f"[warning] held-out evaluation after training: {note}" in out
