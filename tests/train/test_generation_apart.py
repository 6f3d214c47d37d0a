"""Training with generation servers (`rollout.servers`) and asynchronous steps (`rollout.max_staleness`):
k = 0 through one or two servers is in-process training exactly; with k > 0 no row is more than k
versions old and the logged rows' versions agree with the staleness metrics; a server killed mid-run
is survived with two, and with one the run stops with a checkpoint naming it; resume after a kill."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.training.run_control import TrainingError

from _runs import DENSE_REWARD
from _servers import start_servers

# auto corrects with servers (its weights are ~1, not 1); a dense reward so that every step really updates
EXACT = ["algo.sampler_correction=none", "steps=3", "checkpoint.every=0", "rollout.max_new_tokens=6"]


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> str:
    f = tmp_path_factory.mktemp("reward") / "dense.py"
    f.write_text(DENSE_REWARD)
    return f"rewards.0.fn={f}:digit_share"


@pytest.fixture(scope="module")
def servers(tiny_model_dir):
    started = start_servers(tiny_model_dir, 2)
    yield started
    for s in started:
        s.kill()


def _urls(*servers) -> str:
    return "rollout.servers=[" + ",".join(s.url for s in servers) + "]"


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _metrics(trainer) -> list[dict]:
    return [json.loads(line) for line in (trainer.output_dir / "metrics.jsonl").read_text().splitlines()]


def test_k0_through_one_and_two_servers_is_in_process_training(make_trainer, servers, dense):
    ref = make_trainer(*EXACT, dense, run="in_process")
    start = _weights(ref)
    ref.train()
    assert all(r["grad_norm"] > 0 for r in _metrics(ref))  # real updates to compare
    assert any(not torch.equal(start[k], v) for k, v in _weights(ref).items())
    for name, urls in (("one", _urls(servers[0])), ("two", _urls(*servers))):
        t = make_trainer(*EXACT, dense, urls, run=name)
        t.train()
        mine, theirs = _weights(ref), _weights(t)
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), name
        m = _metrics(t)
        assert [r["staleness/max"] for r in m] == [0.0] * 3 and all(r["weight_sync/bytes"] > 0 for r in m)
        if name == "two":  # the rows were spread over both servers
            shares = [v for k, v in m[-1].items() if k.startswith("servers/share/")]
            assert len(shares) == 2 and sum(shares) == pytest.approx(1.0) and min(shares) > 0


def test_auto_sampler_correction_is_on_through_servers(make_trainer, servers, dense):
    from rlvr.config import applied_sampler_correction

    t = make_trainer(_urls(servers[0]), dense, "steps=1", "rollout.max_new_tokens=6")
    assert applied_sampler_correction(t.cfg) == "token_truncate"
    t.train()
    m = _metrics(t)[0]  # the hf server samples with the trainer's code: its log-probs differ only by forward vs decode numerics
    assert abs(m["sampling/importance_sampling_ratio/mean"] - 1) < 1e-4 and m["sampling/sampling_logp_difference/max"] < 1e-4


@pytest.mark.parametrize("k", [1, 2])
def test_no_row_is_more_than_k_versions_old(make_trainer, servers, dense, k):
    t = make_trainer(
        _urls(*servers), dense, f"rollout.max_staleness={k}", "steps=5", "log_completions_every=1", "logging.num_completions=16"
    )
    t.train()
    m = _metrics(t)
    assert [r["step"] for r in m] == [1, 2, 3, 4, 5]
    assert all(r["staleness/max"] <= k for r in m) and max(r["staleness/max"] for r in m) >= 1  # rows really were made ahead
    samples = [json.loads(x) for x in (t.output_dir / "samples.jsonl").read_text().splitlines()]
    for r in m:  # the rows' own versions agree with the step's staleness: step s trains weights of version s - 1
        versions = [x["weight_version"] for x in samples if x["step"] == r["step"]]
        assert versions and max(r["step"] - 1 - v for v in versions) <= r["staleness/max"] <= k
        assert min(versions) >= r["step"] - 1 - k


def _killer(tmp_path, step: int, pid: str = "int(os.environ['RLVR_TEST_KILL_PID'])") -> str:
    """A reward function that SIGKILLs process `pid` (an expression; default $RLVR_TEST_KILL_PID) while scoring step `step`."""
    f = tmp_path / "killer.py"
    f.write_text(
        "import os, signal\n"
        "calls = 0\n"
        "def kill_at(prompts, completions, **kw):\n"
        "    global calls\n"
        "    calls += 1\n"
        f"    if calls == {step}:\n"
        f"        os.kill({pid}, signal.SIGKILL)\n"
        "    return [float(len(c) % 3) for c in completions]\n"
    )
    return f"rewards.0.fn={f}:kill_at"


def test_a_server_killed_mid_run_is_dropped_and_its_rows_made_elsewhere(make_trainer, tiny_model_dir, tmp_path, monkeypatch):
    a, b = start_servers(tiny_model_dir, 2)
    try:
        monkeypatch.setenv("RLVR_TEST_KILL_PID", str(b.proc.pid))
        t = make_trainer(_urls(a, b), "rollout.max_staleness=1", "steps=4", _killer(tmp_path, 2))
        t.train()
        m = _metrics(t)
        assert [r["step"] for r in m] == [1, 2, 3, 4]
        assert m[-1]["servers/alive"] == 1.0 and sum(r.get("servers/dropped", 0) for r in m) == 1
        assert all(r["staleness/max"] <= 1 for r in m)
    finally:
        a.kill()
        b.kill()


def test_with_its_only_server_gone_the_run_stops_with_a_checkpoint(make_trainer, tiny_model_dir, tmp_path, monkeypatch):
    (s,) = start_servers(tiny_model_dir, 1)
    monkeypatch.setenv("RLVR_TEST_KILL_PID", str(s.proc.pid))
    t = make_trainer(_urls(s), "steps=4", "checkpoint.every=0", _killer(tmp_path, 2), "rollout.server_timeout_s=20")
    with pytest.raises(TrainingError) as e:
        t.train()
    s.kill()
    msg = str(e.value)
    assert f"no generation server is left ({s.url}" in msg and "stopped after step 2" in msg and "rlvr train --resume" in msg
    assert (t.output_dir / "checkpoints" / "step-0000002").is_dir()
    assert [json.loads(x)["step"] for x in (t.output_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_resume_through_a_server_is_exact_at_k0(make_trainer, servers, dense):
    straight = make_trainer(*EXACT, dense, _urls(servers[0]), "steps=4", run="straight")
    straight.train()
    make_trainer(*EXACT, dense, _urls(servers[0]), "steps=2", run="parts").train()
    resumed = make_trainer(*EXACT, dense, _urls(servers[1]), "steps=4", "resume=auto", run="parts")  # another server, too
    resumed.train()
    a, b = _weights(straight), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_after_kill_9_at_k1_continues(tiny_model_dir, servers, tmp_path, rlvr_cli, dense):
    from conftest import trainer_defaults

    run = tmp_path / "run"
    args = [*trainer_defaults(tiny_model_dir, run), dense, _urls(servers[0]), "rollout.max_staleness=1", "steps=5", "checkpoint.every=1"]
    killed = rlvr_cli("train", *args, _killer(tmp_path, 4, pid="os.getpid()"), timeout=180)
    assert killed.returncode == -9  # SIGKILL while scoring step 4: rows for step 5 were in flight
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    done = rlvr_cli("train", "--resume", str(run), timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    m = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in m] == [1, 2, 3, 4, 5] and all(r["staleness/max"] <= 1 for r in m)


ROLLOUT_FN = """
from rlvr.data import render_prompt


def through_generate(prompts, *, model, tokenizer, sampling, seeds, generate):
    gen = generate([render_prompt(p, tokenizer) for p in prompts], sampling, seeds)
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
    for r in range(len(gen.texts)):
        keep = gen.completion_mask[r].bool()
        out["prompt_ids"].append(gen.prompt_ids[r][gen.prompt_mask[r].bool()].tolist())
        out["completion_ids"].append(gen.completion_ids[r][keep].tolist())
        out["logprobs"].append(gen.sampling_logprobs[r][keep].tolist())
    return out
"""


def test_a_rollout_function_generates_through_the_servers(make_trainer, servers, dense, tmp_path):
    (tmp_path / "fn.py").write_text(ROLLOUT_FN)
    fn = f"rollout.function={tmp_path / 'fn.py'}:through_generate"
    t = make_trainer(_urls(*servers), dense, fn, "steps=2", "rollout.max_staleness=1", "log_completions_every=1")
    t.train()
    m = _metrics(t)
    assert [r["step"] for r in m] == [1, 2] and all(r["staleness/max"] <= 1 for r in m)
    # the servers made the rows (a step's shares count the rows served since the last step's: with k = 1 a batch made
    # early may fall into the step before)
    assert any(sum(v for k, v in r.items() if k.startswith("servers/share/")) == pytest.approx(1.0) for r in m)
    samples = [json.loads(x) for x in (t.output_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all("weight_version" in x for x in samples)
