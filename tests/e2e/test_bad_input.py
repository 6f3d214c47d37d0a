"""Every bad input gets one clear error naming the thing, and nothing is written or lost."""

import json
import re

import pytest


def _files(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": \n')
    (tmp_path / "noprompt.jsonl").write_text('{"question": "1+1=", "answer": "2"}\n')
    (tmp_path / "noanswer.jsonl").write_text('{"prompt": "1+1=", "solution": "2"}\n')
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "long.jsonl").write_text(json.dumps({"prompt": "1" * 500, "answer": "2"}) + "\n")
    (tmp_path / "rewards.py").write_text(
        "def too_few(prompts, completions, **kw):\n    return [1.0]\n"
        "def words(prompts, completions, **kw):\n    return ['good'] * len(completions)\n"
    )
    (tmp_path / "tok").mkdir()
    from rlvr.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.eos_token = None
    tok.save_pretrained(tmp_path / "tok")


CASES = [
    # (overrides, expected message regex)
    (["data.task=null", "data.path={d}/bad.jsonl"], r"bad.jsonl:2: not valid JSON"),
    (["data.task=null", "data.path={d}/noprompt.jsonl"], r"no prompt column 'prompt'.*\['answer', 'question'\]"),
    (["data.task=null", "data.path={d}/noanswer.jsonl"], r"reward function 'arithmetic_correct' needs a column 'answer'.*\['solution'\]"),
    (["data.task=null", "data.path={d}/empty.jsonl"], r"empty.jsonl: the dataset is empty"),
    (["data.task=null", "data.path={d}/missing.jsonl"], r"file not found: .*missing.jsonl"),
    (["rewards.0.fn={d}/rewards.py:nope"], r"has no function 'nope'"),
    (["optim.lrr=1e-3"], r"unknown config key `optim.lrr`.*did you mean `optim.lr`"),
    (["rollout.group_size=1"], r"`rollout.group_size` must be at least 2"),
    (["rollout.temperature=0"], r"`rollout.temperature` is 0"),
    (["rollout.max_new_tokens=0"], r"`rollout.max_new_tokens` must be positive"),
    (["optim.lr=0"], r"`optim.lr` must be positive"),
    (["rollout.group_size=abc"], r"`rollout.group_size` must be an integer"),
    (["model.path={d}/no-such-model"], r"model.path: folder not found: .*no-such-model"),
    (["model.path={d}/tok"], r"no eos_token"),
    (
        ["data.task=null", "data.path={d}/long.jsonl"],
        r"is 50\d tokens; with rollout.max_new_tokens=8 it does not fit the model's context of 128",
    ),
]


def _train(cli, out, *args):
    """`rlvr train` of 2 short steps into `out`, then ARGS."""
    return cli(
        "train",
        f"output_dir={out}",
        "eval_before_after=false",
        "steps=2",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "threads=1",
        *args,
        timeout=120,
    )


@pytest.mark.parametrize("overrides, message", CASES, ids=[c[1][:40] for c in CASES])
def test_bad_input_is_named_and_nothing_is_written(tmp_path, rlvr_cli, overrides, message):
    _files(tmp_path)
    out = tmp_path / "run"
    proc = _train(rlvr_cli, out, *[o.format(d=tmp_path) for o in overrides])
    assert proc.returncode == 2, (proc.stdout[-1000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    assert re.search(message, proc.stderr), proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) <= 6  # one clear error, not a wall of text
    leftovers = (
        [p for p in out.rglob("*") if p.is_file() and p.name not in ("config.yaml", "metrics.jsonl", "samples.jsonl")]
        if out.exists()
        else []
    )
    assert not leftovers


@pytest.mark.parametrize(
    "fn, message",
    [
        ("too_few", r"reward function 'too_few' failed .*: returned 1 values for 8 completions"),
        ("words", r"reward function 'words' failed .*: returned 'good' \(str\) for completion 0; expected a finite number or None"),
    ],
)
def test_a_broken_reward_function_is_isolated_named_and_counted(tmp_path, rlvr_cli, fn, message):
    """A reward function's bad output never stops training: it is named once, its samples get
    no reward (NaN, left out of the group statistics), and rewards/<fn>/errors counts them."""
    _files(tmp_path)
    out = tmp_path / "run"
    proc = _train(rlvr_cli, out, "rewards.0.fn=arithmetic", f"rewards.1.fn={tmp_path}/rewards.py:{fn}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(re.findall(message, proc.stderr)) == 1, proc.stderr[-2000:]  # once, not every step
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m[f"rewards/{fn}/errors"] for m in metrics] == [8, 8]
    assert all(m["rewards/arithmetic_correct/errors"] == 0 for m in metrics)


def test_a_second_run_into_the_same_output_dir_is_refused(tmp_path, rlvr_cli):
    out = tmp_path / "run"
    assert _train(rlvr_cli, out, "steps=1").returncode == 0
    before = (out / "metrics.jsonl").read_text()
    proc = _train(rlvr_cli, out, "steps=1")
    assert proc.returncode == 2 and "already holds a run" in proc.stderr and f"rlvr train --resume {out}" in proc.stderr
    assert (out / "metrics.jsonl").read_text() == before  # nothing appended, nothing lost
