"""A new user's first hour: own data and reward, held-out numbers for them, starting
over, resuming, interrupting, and mistakes that fail fast with one line. CLI-level where the user
meets it."""

import json
import os
import pty
import re
import time
import types

import pytest
import torch
from rlvr.config import ConfigError, load_config
from rlvr.data.loaders import DataError
from rlvr.models.loading import ModelError, resolve_existing
from rlvr.rewards import RewardError
from rlvr.training.checkpoint import latest_checkpoint, load_trainer_state
from rlvr.training.setup import check_config

# A score the model cannot change: each row's own `expected` column. The held-out mean is then
# known exactly, so the numbers below show which rows were scored, with which columns.
REWARDS = """
def by_column(prompts, completions, expected, **kw):
    return [float(e) for e in expected]
"""
TRAIN = [{"question": f"Q{i}: {i}+{i}=", "expected": 1} for i in range(10, 30)]
HELD_OUT = [{"question": f"H{i}: {i}-1=", "expected": e} for i, e in zip(range(40, 46), [1, 0, 1, 1, 1, 0])]
FAST = ["rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=4", "threads=1", "optim.lr=1e-3"]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def own_data(tmp_path):
    """(train.jsonl, heldout.jsonl, rewards.py) in tmp_path, prompts under `question`."""
    (tmp_path / "rewards.py").write_text(REWARDS)
    return _jsonl(tmp_path / "train.jsonl", TRAIN), _jsonl(tmp_path / "heldout.jsonl", HELD_OUT), tmp_path / "rewards.py"


def _steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------- own data, own held-out set


def test_own_dataset_and_held_out_set_from_yaml(tmp_path, own_data, tiny_model_dir, rlvr_cli):
    """data.path alone (no `data.task: null`) trains on the file; eval.data gives before / during /
    after numbers on the held-out rows; completions of the first and last step are logged even
    though log_completions_every exceeds the run; no progress bars or `1 rank(s)` in the output."""
    train, held, rewards = own_data
    cfg = tmp_path / "my.yaml"
    cfg.write_text(
        f"model: {{path: {tiny_model_dir}}}\n"
        f"data: {{path: {train}, prompt_column: question}}\n"
        f"rewards: [{{fn: '{rewards}:by_column'}}]\n"
        f"eval: {{data: {held}, size: 3}}\n"
        "eval_every: 1\nsteps: 2\nlog_completions_every: 50\nreport_to: []\n"
    )
    out = tmp_path / "run"
    proc = rlvr_cli("train", cfg, f"output_dir={out}", *FAST, check=True)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {1, 2}
    assert {s["prompt"] for s in samples} <= {r["question"] for r in TRAIN}  # the file's prompts, not arithmetic
    summary = json.loads((out / "summary.json").read_text())
    expected = sum(r["expected"] for r in HELD_OUT[:3]) / 3  # eval.size=3: the first three held-out rows
    assert summary["eval_before"] == pytest.approx(expected, abs=1e-12)
    assert summary["eval_after"] == pytest.approx(expected, abs=1e-12)
    assert (summary["eval_set"], summary["eval_label"], summary["eval_rows"]) == (str(held), "mean by_column", 3)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m.get("eval/reward") for m in metrics] == [pytest.approx(expected, abs=1e-12), None]  # the last step's is eval_after
    assert "held-out mean by_column: 0.667 -> 0.667 (+0.000)" in proc.stdout
    assert "held-out mean by_column at step 1: 0.667" in proc.stdout
    assert "Writing model shards" not in proc.stdout + proc.stderr
    assert "rank(s)" not in proc.stdout and "one process" in proc.stdout


def test_a_task_and_a_path_together_are_refused():
    with pytest.raises(ConfigError, match=r"`data.task`=arithmetic and `data.path`=x.jsonl are both set: remove data.task"):
        check_config(load_config(None, ["data.task=arithmetic", "data.path=x.jsonl"]))
    assert load_config(None, []).data.builtin_task == "arithmetic"  # `rlvr train` alone: the demo task
    assert load_config(None, ["data.path=x.jsonl"]).data.builtin_task is None


def test_eval_every_without_a_held_out_set_is_refused_and_a_missing_one_is_said():
    with pytest.raises(ConfigError, match=r"`eval.every`=5 but a data.path run has no held-out set: set eval.data"):
        check_config(load_config(None, ["data.path=x.jsonl", "eval_every=5"]))
    warnings = check_config(load_config(None, ["data.path=x.jsonl"]))
    assert any(w.startswith("no held-out evaluation: data.path has no held-out split; set eval.data") for w in warnings)


def test_rlvr_eval_on_a_jsonl_with_a_reward(tmp_path, own_data, tiny_model_dir, rlvr_cli):
    _, held, rewards = own_data
    common = ["--data", held, "--prompt-column", "question", "--reward", f"{rewards}:by_column"]
    proc = rlvr_cli("eval", tiny_model_dir, *common, "--n", "4", check=True)
    assert f"{held} held-out mean by_column (4 rows, greedy): 0.750" in proc.stdout
    missing = rlvr_cli("eval", tmp_path / "runs" / "nope" / "final", *common)
    assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
        f"rlvr: error: rlvr eval MODEL: folder not found: {tmp_path / 'runs' / 'nope' / 'final'}"
    ]
    no_reward = rlvr_cli("eval", tiny_model_dir, "--data", held)
    assert no_reward.returncode == 2 and "rlvr eval --data needs --reward" in no_reward.stderr


def test_rlvr_eval_help_explains_every_option(rlvr_cli):
    text = rlvr_cli("eval", "--help", check=True).stdout
    options = re.findall(r"^  (-[-\w]+(?: [A-Z_]+)?)(.*)$", text, flags=re.M)
    assert {o.split()[0] for o, _ in options} >= {"--task", "--data", "--reward", "--prompt-column", "--n", "--max-new-tokens"}
    lines = text.splitlines()
    for option, rest in options:  # a description on the same line, or indented on the next
        follow = lines[lines.index(f"  {option}{rest}") + 1]
        assert rest.strip() or follow.startswith(" " * 10), f"{option} has no help text"


# --------------------------------------------------------------------------- starting over, flags, resuming


def test_force_starts_over_with_flags_anywhere_and_leaves_nothing_to_resume(tmp_path, tiny_model_dir, rlvr_cli):
    out = tmp_path / "run"
    base = ["train", f"model.path={tiny_model_dir}", *FAST, "eval_before_after=false"]
    rlvr_cli(*base, f"output_dir={out}", "steps=2", "save_every=1", "log_completions_every=1", check=True)
    assert latest_checkpoint(out / "checkpoints") is not None
    again = rlvr_cli(
        "train",
        f"model.path={tiny_model_dir}",
        "--force",
        f"output_dir={out}",
        *FAST,
        "steps=1",
        "seed=1",
        "eval_before_after=false",
        check=True,
    )  # --force between overrides
    (aside,) = tmp_path.glob("run.replaced-*")
    assert f"the run that was in {out} is now in {aside}" in again.stdout
    assert latest_checkpoint(aside / "checkpoints").name == "step-0000002" and _steps(aside / "metrics.jsonl") == [1, 2]
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-0000001"]  # the new run's end, nothing of the old
    assert _steps(out / "metrics.jsonl") == [1]
    assert {json.loads(x)["step"] for x in (out / "samples.jsonl").read_text().splitlines()} == {1}
    resumed = rlvr_cli("train", "--resume", out, "steps=2", check=True)  # the new run continues from its own end
    assert _steps(out / "metrics.jsonl") == [1, 2] and _steps(aside / "metrics.jsonl") == [1, 2]
    assert "now in" not in resumed.stdout


@pytest.mark.parametrize(
    "argv, config, overrides, force",
    [
        (["train", "my.yaml", "--force", "output_dir=x", "steps=3"], "my.yaml", ["output_dir=x", "steps=3"], True),
        (["train", "--force", "my.yaml", "steps=3"], "my.yaml", ["steps=3"], True),
        (["train", "steps=3", "--force", "output_dir=x", "seed=2"], "steps=3", ["output_dir=x", "seed=2"], True),
        (["train", "output_dir=x", "--resume", "runs/a", "steps=9"], "output_dir=x", ["steps=9"], False),
    ],
)
def test_flags_and_overrides_in_any_order(monkeypatch, argv, config, overrides, force):
    from rlvr import cli

    seen = {}
    monkeypatch.setattr(cli, "_train", lambda args: seen.update(vars(args)) or 0)
    assert cli.main(argv) == 0
    assert (seen["config"], seen["overrides"], seen["force"]) == (config, overrides, force)


def test_resume_from_the_run_folder_alone(tmp_path, tiny_model_dir, rlvr_cli):
    """`rlvr train --resume RUN_DIR steps=N` continues with the run's own config.yaml; a setting that
    changes the math is refused; TensorBoard holds each step once after resuming from a checkpoint
    older than the last logged step (a run killed between checkpoints); train_seconds covers both segments."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    rlvr_cli(
        "train",
        f"model.path={tiny_model_dir}",
        *FAST,
        f"output_dir={out}",
        "steps=3",
        "save_every=1",
        "eval_before_after=false",
        "report_to=[tensorboard]",
        check=True,
    )
    import shutil

    for done in (out / "final", out / "checkpoints" / "step-0000003"):  # as a kill after step 3 was logged leaves it
        shutil.rmtree(done)
    (out / "summary.json").unlink()
    ckpt = latest_checkpoint(out / "checkpoints")
    assert ckpt.name == "step-0000002"  # the run logged step 3 after it
    earlier = load_trainer_state(ckpt)["train_seconds"]  # read now: the resumed run's checkpoints prune it
    refused = rlvr_cli("train", "--resume", out, "algo.epsilon=0.3")
    assert refused.returncode == 2 and "algo.epsilon: 0.2 -> 0.3" in refused.stderr
    rlvr_cli("train", "--resume", out, "steps=4", check=True)
    assert _steps(out / "metrics.jsonl") == [1, 2, 3, 4]
    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward")] == [1, 2, 3, 4]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert earlier >= metrics[0]["time/step"] + metrics[1]["time/step"]
    assert json.loads((out / "summary.json").read_text())["train_seconds"] >= earlier + metrics[2]["time/step"] + metrics[3]["time/step"]


def test_train_seconds_add_up_over_segments(make_trainer, monkeypatch):
    """Each step is one tick of a fake clock: 1 s before the checkpoint, 2 s after it, 3 s in all."""
    from rlvr.training import trainer as trainer_module

    ticks = iter(range(1000))
    monkeypatch.setattr(
        trainer_module,
        "time",
        types.SimpleNamespace(time=lambda: float(next(ticks)), perf_counter=time.perf_counter, strftime=time.strftime),
    )
    first = make_trainer("steps=1")
    first.train()
    first.save_checkpoint()  # as save_every=1 would at step 1 of a longer run
    assert first.state.train_seconds == 1.0
    again = make_trainer("steps=3", "save_every=1", "resume=auto")
    assert again.state.train_seconds == 1.0
    assert again.train()["train_seconds"] == 3.0


# --------------------------------------------------------------------------- interrupts


def test_closing_the_terminal_saves_a_checkpoint_and_exits_zero(tmp_path, tiny_model_dir, rlvr_cli):
    """The run's terminal goes away (a pty whose master is closed: the kernel sends SIGHUP, and
    writes to the terminal fail from then on): it finishes the step, saves, and exits 0."""
    out = tmp_path / "run"
    argv = rlvr_cli.command(
        "train",
        f"model.path={tiny_model_dir}",
        *FAST,
        "steps=100000",
        "save_every=0",
        f"output_dir={out}",
        "eval_before_after=false",
        "report_to=[]",
    )
    pid, master = pty.fork()
    if pid == 0:  # the child: session leader with the pty as its controlling terminal
        os.execvpe(argv[0], argv, {**os.environ, "TERM": "xterm", "CI": ""})
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        try:
            os.read(master, 65536)  # keep the terminal drained, as a real one is
        except OSError:
            break
    os.close(master)  # the terminal window closes
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    ckpt = latest_checkpoint(out / "checkpoints")
    assert ckpt is not None and ckpt.name == f"step-{len(metrics.read_text().splitlines()):07d}"
    assert not (out / "final").exists()


# --------------------------------------------------------------------------- failing fast


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (["data.path={d}/missing.jsonl"], DataError, r"file not found: .*missing.jsonl"),
        (["data.path={d}/train.jsonl"], DataError, r"no prompt column 'prompt'"),
        (
            ["data.path={d}/train.jsonl", "data.prompt_column=question", "rewards=[{d}/rewards.py:nope]"],
            RewardError,
            r"has no function 'nope'",
        ),
        (["data.path={d}/train.jsonl", "data.prompt_column=question", "rewards=[arithmetic]"], ValueError, r"needs a column 'answer'"),
        (
            ["eval_before_after=true", "eval.data={d}/heldout.jsonl", "eval.prompt_column=question", "eval.reward=arithmetic"],
            ValueError,
            r"needs a column 'answer'",
        ),
    ],
)
def test_data_and_reward_mistakes_are_found_before_any_model_loads(make_trainer, own_data, no_model_load, overrides, error, message):
    d = own_data[0].parent
    with pytest.raises(error, match=message):
        make_trainer(*[o.format(d=d) for o in overrides])


def test_a_used_output_dir_is_refused_before_any_model_loads(make_trainer, tmp_path, no_model_load):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ConfigError, match=rf"output_dir {tmp_path / 'run'} already holds a run: continue it with `rlvr train --resume"):
        make_trainer()


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a model or tokenizer in the trainer fails the test."""
    from rlvr.training import trainer as trainer_module

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the data, rewards and output folder were checked")

    monkeypatch.setattr(trainer_module, "load_tokenizer", no_model)
    monkeypatch.setattr(trainer_module, "load_policy", no_model)


def test_an_unreachable_hub_fails_in_seconds_with_one_line(monkeypatch):
    import socket

    from huggingface_hub import constants

    def hangs(*args, **kwargs):  # a name lookup or connect that answers long after the check gave up
        time.sleep(8)
        raise TimeoutError("timed out")

    for endpoint, reason in (
        ("http://127.0.0.1:9", r"127.0.0.1:9 cannot be reached \(Connection refused\)"),
        ("http://hub.invalid:443", r"hub.invalid:443 did not answer within 3 s"),
    ):
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        if "invalid" in endpoint:
            monkeypatch.setattr(socket, "create_connection", hangs)
        t0 = time.perf_counter()
        with pytest.raises(
            ModelError,
            match=r"^model.path: someone/not-cached-model is not a local folder nor in the Hugging Face cache, "
            rf"and the hub cannot be used \({reason}\)",
        ):
            resolve_existing("someone/not-cached-model")
        assert time.perf_counter() - t0 < 5
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError, match=r"\(HF_HUB_OFFLINE is set\)"):
        resolve_existing("someone/not-cached-model")


def test_an_unreachable_hub_through_the_cli(tmp_path, rlvr_cli):
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path / "hub")}
    proc = rlvr_cli("train", "model.path=someone/not-cached-model", "steps=1", f"output_dir={tmp_path / 'run'}", env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "rlvr: error: model.path: someone/not-cached-model is not a local folder nor in the Hugging Face cache, and the hub cannot be used "
        "(127.0.0.1:9 cannot be reached (Connection refused)): download it where there is network, or give a local folder"
    ]


def test_a_cached_hub_id_loads_while_the_hub_is_unreachable(tmp_path, tiny_model_dir, monkeypatch):
    """A hub id already in the cache loads from it, without asking the unreachable hub."""
    from huggingface_hub import constants
    from transformers import AutoModelForCausalLM

    from rlvr.models.loading import load_model, load_tokenizer

    snapshot = tmp_path / "hub" / "models--someone--tiny" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for f in os.listdir(tiny_model_dir):
        os.symlink(os.path.join(tiny_model_dir, f), snapshot / f)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abc")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    expected, local_tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict(), load_tokenizer(tiny_model_dir)[0]
    t0 = time.perf_counter()  # (transformers' classes are imported by now: the time below is the lookup and load)
    tok, _ = load_tokenizer("someone/tiny")
    model = load_model("someone/tiny")
    assert time.perf_counter() - t0 < 5
    assert model.state_dict().keys() == expected.keys() and all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    assert tok("1+2=")["input_ids"] == local_tok("1+2=")["input_ids"]


def test_the_report_shows_a_held_out_score_of_your_own_reward(tmp_path):
    """The report names the held-out set and the reward, with before / during / after numbers."""
    from _runs import write_metrics

    from rlvr.observe.report import make_report

    run = write_metrics(tmp_path / "run", [{"step": s, "reward": 0.1 * s, **({"eval/reward": 0.5} if s == 2 else {})} for s in (1, 2, 3)])
    (run / "summary.json").write_text(
        json.dumps(
            {
                "eval_before": 0.25,
                "eval_after": 0.75,
                "eval_set": "test.jsonl",
                "eval_label": "mean correct",
                "eval_rows": 40,
                "train_seconds": 3.0,
            }
        )
    )
    page = make_report([run], tmp_path / "report").read_text()
    assert "<th>held-out score</th>" in page and "0.250 → 0.750" in page
    assert "Held-out score" in page and "(test.jsonl), before and after training, and every eval.every steps." in page
