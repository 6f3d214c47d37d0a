"""`rollout.agent`: a plain `openai`-client agent trains the policy through the endpoint; the trained ids are the
sampled ones with the agent's tokens masked; agents that raise, hang, return the wrong type or never call are
counted and left out while the run goes on; all failing stops the run; a history rewrite is a counted split, its sequences trained with the
episode's advantage."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from rlvr.rollout.sources.agent.source import AgentFailed

AGENTS = """
import time
from openai import OpenAI


def _chat(row, base_url, model, api_key):
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": row["prompt"]}]
    first = client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=1.0)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again?"}]
    second = client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=1.0)
    return client, messages, second.choices[0].message.content or ""


def two_calls(row, base_url, model, api_key):
    _, _, text = _chat(row, base_url, model, api_key)
    return float(str(row["answer"]) in text)


def mixed(row, base_url, model, api_key):
    q = int(row["answer"]) % 4
    if q == 0:
        raise RuntimeError("agent bug")
    if q == 1:
        time.sleep(30)
    if q == 2:
        return "not a number"
    return two_calls(row, base_url, model, api_key)


def always_fails(row, base_url, model, api_key):
    raise KeyError("no tool")


def no_calls(row, base_url, model, api_key):
    return 1.0


def rewrites(row, base_url, model, api_key):
    client, messages, _ = _chat(row, base_url, model, api_key)
    messages[1] = {"role": "assistant", "content": "something else"}  # history rewritten
    client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    return None
"""


@pytest.fixture
def agents(tmp_path):
    (tmp_path / "agents.py").write_text(AGENTS)
    return tmp_path / "agents.py"


def _trainer(make_trainer, agents, fn, *extra):
    return make_trainer(f"rollout.agent={agents}:{fn}", "rewards=[]", "steps=1", "rollout.max_new_tokens=4", *extra, run=fn)


def test_the_trained_ids_are_the_sampled_ones(make_trainer, agents):
    t = _trainer(make_trainer, agents, "two_calls", "log_completions_every=1")
    t.train()
    m = json.loads((t.output_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert m["agent/calls_per_episode"] == 2.0 and m["agent/split_episodes"] == 0 and m["agent/error_frequency"] == 0
    assert t.source.decoder is not None  # the hf engine: requests through its continuous decoder
    e, logs = t.last_step.batch.episodes, t.source.last_logs
    assert len(e) == len(logs) == 16 and bool(e.valid.all())
    for r, log in enumerate(logs):
        first, second = log.snapshot()
        seq = e.completion_ids[r][e.attention_mask[r].bool()].tolist()
        mask = e.loss_mask[r][e.attention_mask[r].bool()].tolist()
        prompt = e.prompt_ids[r][e.prompt_mask[r].bool()].tolist()
        assert prompt == first.prompt_ids and prompt + seq == second.prompt_ids + second.sampled_ids  # one sequence
        between = second.prompt_ids[len(first.prompt_ids) + len(first.sampled_ids) :]  # the agent's turn + template glue
        assert mask == [1] * len(first.sampled_ids) + [0] * len(between) + [1] * len(second.sampled_ids)
        trained = [i for i, k in zip(seq, mask) if k]
        assert trained == first.sampled_ids + second.sampled_ids
        lp = e.sampling_logprobs[r][e.attention_mask[r].bool()][torch.tensor(mask).bool()].tolist()
        assert lp == pytest.approx(first.logprobs + second.logprobs, abs=0)
    sample = json.loads((t.output_dir / "samples.jsonl").read_text().splitlines()[0])  # the run log shows each call in order
    calls, log = sample["agent_calls"], t.source.last_logs[0]
    first, second = log.snapshot()
    assert [c["call"] for c in calls] == [0, 1] and [c["sequence"] for c in calls] == [0, 0]
    assert calls[0]["sent"] == first.messages and calls[1]["sent"] == [{"role": "user", "content": "again?"}]
    assert calls[1]["reply"] == second.reply and calls[1]["sampled_tokens"] == len(second.sampled_ids)


def test_failing_agents_are_counted_and_the_run_goes_on(make_trainer, agents):
    t = _trainer(make_trainer, agents, "mixed", "rollout.agent_timeout=3", "rollout.prompts_per_step=8")
    t.train()
    m = json.loads((t.output_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert m["agent/error_frequency"] > 0 and m["agent/timeout_frequency"] > 0
    assert t.source.stats.first_error in {
        "RuntimeError: agent bug",
        "the agent ran past rollout.agent_timeout=3s",
        "the agent returned str 'not a number': it must return a float reward or None",
    }
    v = t.last_step.batch.episodes.valid
    assert 0 < int(v.sum()) < len(v)  # the failed episodes are left out, the others trained


def test_an_agent_failing_everywhere_stops_the_run_with_its_error(make_trainer, agents):
    with pytest.raises(AgentFailed, match=r"failed on every episode of the step; the first: KeyError: 'no tool'"):
        _trainer(make_trainer, agents, "always_fails").train()


def test_an_agent_that_never_calls_is_reported_not_trained(make_trainer, agents):
    t = _trainer(make_trainer, agents, "no_calls")
    t.train()
    m = json.loads((t.output_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert m["agent/no_call_episodes"] == 16 and not bool(t.last_step.batch.episodes.valid.any())


def test_a_rewritten_history_is_a_counted_split_trained_with_its_episodes_advantage(make_trainer, agents):
    from rlvr.training.minibatches import this_ranks_minibatches

    t = _trainer(make_trainer, agents, "rewrites", "rewards=[length]")
    t.train()
    m = json.loads((t.output_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert m["agent/split_episodes"] == 16
    batch, adv = t.last_step.batch, t.last_step.advantages
    e, x = batch.episodes, batch.episodes.extra_sequences
    assert len(e) == 16 and bool(e.valid.all()) and x is not None and e.extra_sequence_of.tolist() == list(range(16))
    for r, log in enumerate(t.source.last_logs):
        first, second, third = log.snapshot()  # the third call's history was rewritten: a sequence of its own
        row = e.prompt_ids[r][e.prompt_mask[r].bool()].tolist() + e.completion_ids[r][e.attention_mask[r].bool()].tolist()
        assert row == second.prompt_ids + second.sampled_ids
        prompt = x.prompt_ids[r][x.prompt_mask[r].bool()].tolist()
        seq, mask = x.completion_ids[r][x.attention_mask[r].bool()].tolist(), x.loss_mask[r][x.attention_mask[r].bool()].tolist()
        assert prompt == third.prompt_ids and seq == third.sampled_ids and mask == [1] * len(seq)
    (share,) = this_ranks_minibatches(batch, adv, 1, t.dist)  # what the update trained
    assert len(share.episodes) == 32 and torch.equal(share.advantages[16:], adv)  # each with its episode's advantage
    assert m["num_tokens"] == int(e.prompt_mask.sum() + e.attention_mask.sum() + x.prompt_mask.sum() + x.attention_mask.sum())


def test_the_example_calculator_agent_runs_against_the_endpoint(make_trainer):
    from _paths import REPO

    t = make_trainer(f"rollout.agent={REPO / 'examples' / 'agent_openai.py'}:calculator_agent", "rewards=[]", "steps=1",
                     "rollout.max_new_tokens=8", run="example")  # fmt: skip
    t.train()
    m = json.loads((t.output_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert m["agent/error_frequency"] == 0 and m["agent/calls_per_episode"] >= 1 and "rewards/agent/mean" in m


def test_rlvr_eval_runs_the_same_agent(rlvr_cli, agents, tmp_path):
    data = tmp_path / "held.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)))
    ok = rlvr_cli("eval", "tiny", "--data", str(data), "--agent", f"{agents}:two_calls", timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "episodes run by rollout.agent" in ok.stdout
    line = ok.stdout.strip().splitlines()[-1]
    assert line.startswith(f"{data} held-out mean agent (4 rows, the agent's sampling): ")
    score = float(line.rsplit(" ", 1)[1])
    assert 0.0 <= score <= 1.0
    failed = rlvr_cli("eval", "tiny", "--data", str(data), "--agent", f"{agents}:always_fails", timeout=120)
    assert failed.returncode != 0 and "rollout.agent failed on every episode of the step; the first: KeyError: 'no tool'" in failed.stderr


def test_an_agent_trains_through_generation_servers(make_trainer, agents, tiny_model_dir):
    from _servers import start_servers

    (server,) = start_servers(tiny_model_dir, 1)
    try:
        t = _trainer(make_trainer, agents, "two_calls", f"rollout.servers=[{server.url}]", "steps=2")
        t.train()
    finally:
        server.kill()
    rows = [json.loads(x) for x in (t.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["agent/calls_per_episode"] == 2.0 for r in rows)
    assert all(sum(v for k, v in r.items() if k.startswith("servers/share/")) == pytest.approx(1.0) for r in rows)


def test_the_agents_requests_decode_on_the_thread_that_runs_the_rollout(make_trainer, agents):
    """The hf engine's continuous decoder runs on the trainer's own thread (the main one), not a thread of its own: on a GPU,
    model work from other threads ran up to 8x slower (bench/results/gpu_server_overhead.md)."""
    t = _trainer(make_trainer, agents, "two_calls")
    forwards: list[int] = []
    hook = t.model.register_forward_pre_hook(lambda *_: forwards.append(threading.get_ident()))
    try:
        t.train()
    finally:
        hook.remove()
    assert t.source.last_logs and all(len(log.snapshot()) == 2 for log in t.source.last_logs)
    assert forwards and set(forwards) == {threading.get_ident()}
