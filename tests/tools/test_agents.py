"""Multi-turn episodes with tools, through the real trainer and real tiny models that call tools
(tests/_callers.py): the token layout is exact, tool tokens get no gradient, every kind of tool
failure becomes a message the model sees and a count, and nothing stalls a step past its limits."""

from __future__ import annotations

import json
import textwrap
import time

import pytest
import torch

from _callers import HERMES_MINI, hermes_tokenizer, train_caller
from rlvr import algo
from rlvr.models.tokenizer import build_char_tokenizer

RESULTS = ["408", "error: boom", "error: calculator timed out after 0.5s", "error: bad arguments", "error: unknown"]

TOOLS = '''
import asyncio, time


def multiply(expression: str) -> str:
    """Multiply.

    Args:
        expression: a product like 12*34

    Returns:
        The product.
    """
    a, b = expression.split("*")
    return str(int(a) * int(b))


def sleepy(expression: str) -> str:
    """Sleep half a second, then multiply.

    Args:
        expression: a product

    Returns:
        The product.
    """
    time.sleep(0.5)
    return multiply(expression)


def raises(expression: str) -> str:
    """Always fails.

    Args:
        expression: anything

    Returns:
        Nothing.
    """
    raise RuntimeError("boom")


def hangs(expression: str) -> str:
    """Never returns.

    Args:
        expression: anything

    Returns:
        Nothing.
    """
    time.sleep(3600)


def returns_none(expression: str) -> str:
    """Returns None.

    Args:
        expression: anything

    Returns:
        Nothing.
    """
    return None


def wants_int(number: int) -> str:
    """Needs an integer.

    Args:
        number: an integer

    Returns:
        It.
    """
    return str(number)
'''


@pytest.fixture(scope="module")
def tag_caller(tmp_path_factory):
    """The bundled char tokenizer; a model that writes `<calc>12*34</calc>`, then `408` after the result."""
    tok = build_char_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "12*34="}], add_generation_prompt=True, tokenize=False)
    episodes = [
        [(prompt, False), ("<calc>12*34</calc>", True), (f"<result>{r}</result>", False), ("408" + tok.eos_token, True)] for r in RESULTS
    ]
    model, loss = train_caller(tok, episodes, steps=250)
    assert loss < 0.01
    path = tmp_path_factory.mktemp("tag_caller")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    (path / "tools.py").write_text(textwrap.dedent(TOOLS))
    data = path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": "12*34="}], "answer": "408"}) + "\n" for _ in range(4)))
    return path


def _tag_trainer(make_trainer, path, tool, *overrides, G=4):
    return make_trainer(
        f"model.path={path}",
        "data.task=null",
        f"data.path={path / 'data.jsonl'}",
        "rewards=[final_answer]",
        f"tools.functions=[{path / 'tools.py'}:{tool}]",
        f"tools.tags=[{tool}=calc]",
        "tools.format=tags",
        "tools.describe=false",  # the caller learnt its episodes after the bare prompt
        "tools.timeout_s=0.5",
        f"rollout.group_size={G}",
        "rollout.prompts_per_step=2",
        "rollout.max_new_tokens=64",
        "optim.skip_zero_advantage=false",
        "algo.scale_rewards=none",
        *overrides,
        run=tool,
    )


def _conversations(batch):
    return batch.episodes.completions


def test_tag_episode_layout_exactness_and_zero_gradient_on_tool_tokens(make_trainer, tag_caller, monkeypatch):
    t = _tag_trainer(make_trainer, tag_caller, "multiply")
    batch = t.collector.collect(t.state)
    e = batch.episodes
    tok = t.tokenizer
    for i in range(len(e)):
        n = int(e.attention_mask[i].sum())
        ids, loss = e.completion_ids[i, :n].tolist(), e.loss_mask[i, :n].tolist()
        # the model's tokens are its two turns, the external ones exactly the tokenised result
        assert tok.decode([x for x, m in zip(ids, loss) if m]) == "<calc>12*34</calc>408</s>"
        assert [x for x, m in zip(ids, loss) if not m] == tok("<result>408</result>", add_special_tokens=False)["input_ids"]
        assert ids[-1] == tok.eos_token_id and loss[-1] == 1
    assert _conversations(batch)[0] == [
        {"role": "assistant", "content": "<calc>12*34</calc>"},
        {"role": "tool", "name": "multiply", "content": "408"},
        {"role": "assistant", "content": "408"},
    ]
    assert batch.rewards[:, 0].tolist() == [1.0] * len(e)
    # the sampler's log-probs of every model token equal a fresh forward over the whole episode
    out, C = t.updater.forward(t.model, e.to(t.device), slice(0, len(e)), with_entropy=False)
    m = e.loss_mask[:, :C].bool()
    torch.testing.assert_close(out.logp.detach()[m], e.sampling_logprobs[:, :C][m], rtol=1e-5, atol=1e-5)
    # tool tokens get exactly zero gradient; the loss counts the model's tokens only
    seen = []
    real = algo.policy_loss

    def spy(logp, old_logp, advantages, mask, norms, **kw):
        logp.retain_grad()
        seen.append((logp, mask, norms))
        return real(logp, old_logp, advantages, mask, norms, **kw)

    monkeypatch.setattr(algo, "policy_loss", spy)
    adv = torch.linspace(-1, 1, len(e))
    t.updater(e, adv)
    logp, mask, norms = seen[0]
    assert norms.num_tokens == int(e.loss_mask.sum()) == len(e) * len("<calc>12*34</calc>408</s>".replace("</s>", "x"))
    assert torch.all(logp.grad[mask == 0] == 0) and (logp.grad[mask == 1] != 0).any()
    assert torch.equal(torch.nn.functional.pad(mask, (0, e.loss_mask.shape[1] - mask.shape[1])).long(), e.loss_mask)
    metrics = t.source.metrics(e)
    assert metrics["tools/call_frequency"] == 1.0 and metrics["tools/failure_frequency"] == 0.0
    assert metrics["tools/multiply/call_frequency"] == 1.0 and metrics["episodes/turns"] == 2.0
    assert metrics["episodes/external_token_share"] == pytest.approx(
        len("<result>408</result>") / len("<calc>12*34</calc><result>408</result>408x")
    )


@pytest.mark.parametrize(
    "tool, message",
    [
        ("raises", "error: raises raised RuntimeError: boom"),
        ("hangs", "error: hangs timed out after 0.5s"),
        ("returns_none", "error: returns_none returned None"),
        ("wants_int", "error: bad arguments for wants_int"),
    ],
)
def test_every_tool_failure_is_a_message_and_a_count_and_the_run_goes_on(make_trainer, tag_caller, tool, message):
    t = _tag_trainer(make_trainer, tag_caller, tool, "steps=2")
    t0 = time.perf_counter()
    metrics = [t.train_step() for _ in range(2)]
    assert time.perf_counter() - t0 < 10  # a hanging tool costs its timeout, not more
    conv = _conversations(t.last_step.batch)[0]
    assert conv[1]["role"] == "tool" and conv[1]["content"].startswith(message), conv
    assert all(m["tools/failure_frequency"] == 1.0 and m["tools/call_frequency"] == 1.0 for m in metrics)
    assert t.state.step == 2


def test_tool_calls_of_a_step_run_concurrently(make_trainer, tag_caller):
    """Eight episodes, each calling a tool that sleeps 0.5 s: the step's generation takes well under 8 x 0.5 s."""
    t = _tag_trainer(make_trainer, tag_caller, "sleepy", "rollout.prompts_per_step=1", "tools.timeout_s=3", G=8)
    t.train_step()  # warm-up (threads, first forward)
    m = t.train_step()
    assert m["tools/call_frequency"] == 1.0 and m["tools/failure_frequency"] == 0.0
    assert m["time/generate"] < 2.0, m["time/generate"]


@pytest.fixture(scope="module")
def hermes_caller(tmp_path_factory):
    """A Hermes-style template; a model that answers `12*34=` by calling `calculator` and `99*2=` by
    calling a tool that does not exist, then writes `408` after whatever comes back."""
    tok = hermes_tokenizer()
    path = tmp_path_factory.mktemp("hermes_caller")
    (path / "tools.py").write_text(textwrap.dedent(TOOLS))
    from rlvr.tools import ToolSet

    schemas = ToolSet(["calculator", f"{path / 'tools.py'}:multiply"]).schemas
    glue = "\n<|im_start|>user\n<tool_response>{}</tool_response><|im_end|>\n<|im_start|>assistant\n"
    episodes = []
    for question, name in (("12*34=", "calculator"), ("99*2=", "nope")):
        prompt = tok.apply_chat_template([{"role": "user", "content": question}], tools=schemas, add_generation_prompt=True, tokenize=False)
        call = '<tool_call>{"name": "%s", "arguments": {"expression": "12*34"}}</tool_call><|im_end|>' % name
        episodes += [[(prompt, False), (call, True), (glue.format(r), False), ("408<|im_end|>", True)] for r in RESULTS[:3]]
    model, loss = train_caller(tok, episodes, steps=250)
    assert loss < 0.01
    model.save_pretrained(path / "m")
    tok.save_pretrained(path / "m")
    for question in ("12*34=", "99*2="):
        (path / f"{question[:2]}.jsonl").write_text(json.dumps({"prompt": [{"role": "user", "content": question}], "answer": "408"}) + "\n")
    return path, schemas


def _hermes_trainer(make_trainer, path, question, run):
    return make_trainer(
        f"model.path={path / 'm'}",
        "data.task=null",
        f"data.path={path / (question[:2] + '.jsonl')}",
        "rewards=[final_answer]",
        f"tools.functions=[calculator, {path / 'tools.py'}:multiply]",
        "tools.format=auto",
        "rollout.prompts_per_step=1",
        "rollout.max_new_tokens=180",
        run=run,
    )


def test_hermes_chat_template_path(make_trainer, hermes_caller):
    """Tool calls through a Hermes-style chat template: calls parsed from JSON, results as tool
    messages, the appended glue equal to the template's own rendering of the conversation."""
    path, schemas = hermes_caller
    t = _hermes_trainer(make_trainer, path, "12*34=", "hermes")
    tok = t.tokenizer
    e = t.collector.collect(t.state).episodes
    conv = e.completions[0]
    assert conv[0]["tool_calls"] == [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*34"}}}]
    assert conv[1] == {"role": "tool", "name": "calculator", "content": "408"}
    assert conv[2] == {"role": "assistant", "content": "408"}
    n = int(e.attention_mask[0].sum())
    context = tok.decode(e.prompt_ids[0][e.prompt_mask[0].bool()].tolist() + e.completion_ids[0, :n].tolist())
    full = tok.apply_chat_template([{"role": "user", "content": "12*34="}, *conv], tools=schemas, tokenize=False)
    assert context + "\n" == full  # the template writes "\n" after the final <|im_end|>, which the model does not sample
    out, C = t.updater.forward(t.model, e.to(t.device), slice(0, len(e)), with_entropy=False)
    m = e.loss_mask[:, :C].bool()
    torch.testing.assert_close(out.logp.detach()[m], e.sampling_logprobs[:, :C][m], rtol=1e-5, atol=1e-5)


def test_unknown_tool_through_the_chat_template(make_trainer, hermes_caller):
    path, _ = hermes_caller
    t = _hermes_trainer(make_trainer, path, "99*2=", "unknown")
    m = t.train_step()
    conv = t.last_step.batch.episodes.completions[0]
    assert conv[1]["role"] == "tool" and conv[1]["content"].startswith("error: tool 'nope' is not available"), conv
    assert m["tools/failure_frequency"] == 1.0


def test_a_template_that_rewrites_earlier_turns_is_refused_at_start_up(make_trainer, tmp_path):
    rewrites = HERMES_MINI.replace(
        "{{- '<|im_start|>assistant\\n' + (m.content or '') }}",
        "{{- '<|im_start|>assistant\\n' + ('<think></think>' if loop.last else '') + (m.content or '') }}",
    )
    tok = hermes_tokenizer(rewrites)
    model, _ = train_caller(tok, [[("x", False), ("y", True)]], steps=1)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="prefix-preserving.*tools.format=tags"):
        make_trainer(f"model.path={tmp_path / 'm'}", "tools.functions=[calculator]", "tools.format=chat_template")


# A TRL-documented environment_factory class, unchanged in shape: reserved reset / get_reward,
# every other public method a tool with type hints and a Google docstring.
TRL_ENV = '''
class CalcEnv:
    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.calls = 0
        self.answer = kwargs.get("answer")
        return None

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.calls == 1)

    # Public methods (exposed as tools)
    def multiply(self, expression: str) -> str:
        """
        Multiply two integers written as a*b.

        Args:
            expression: The product to compute, e.g. 12*34.

        Returns:
            The product.
        """
        self.calls += 1
        a, b = expression.split("*")
        return str(int(a) * int(b))
'''

ROLLOUT_FN = '''
import torch


def my_rollout(prompts, *, model, tokenizer, sampling, seeds):
    """Samples with the model's own generate(), then appends an external reply (env_mask 0) and a
    last model token, as an environment-driven rollout would."""
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "source": []}
    for p, seed in zip(prompts, seeds):
        text = tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for j in range(sampling.n):
            torch.manual_seed(seed * 100 + j)
            gen = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=True, top_k=0,
                                 output_scores=True, return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)
            new = gen.sequences[0, len(ids):].tolist()
            lps = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(gen.scores, new)]
            reply = tokenizer("!ok", add_special_tokens=False)["input_ids"]
            out["prompt_ids"].append(ids)
            out["completion_ids"].append(new + reply)
            out["logprobs"].append(lps + [0.0] * len(reply))
            out["env_mask"].append([1] * len(new) + [0] * len(reply))
            out["source"].append(f"rollout {j}")
    return out


def saw_source(prompts, completions, source, **kw):
    return [float(s.startswith("rollout")) * (len(c[0]["content"]) % 3) for s, c in zip(source, completions)]
'''


def test_trl_style_environment_trains_through_the_cli(rlvr_cli, tag_caller, tmp_path):
    (tmp_path / "env.py").write_text(TRL_ENV)
    out = tmp_path / "run"
    rlvr_cli(
        "train",
        f"output_dir={out}",
        f"model.path={tag_caller}",
        "data.task=null",
        f"data.path={tag_caller / 'data.jsonl'}",
        "rewards=[final_answer]",
        f"tools.environment={tmp_path / 'env.py'}:CalcEnv",
        "tools.tags=[multiply=calc]",
        "tools.describe=false",
        "rollout.group_size=4",
        "rollout.prompts_per_step=2",
        "rollout.max_new_tokens=64",
        "steps=2",
        "eval_before_after=false",
        "threads=1",
        "report_to=[]",
        "log_completions_every=1",
        check=True,
        timeout=300,
    )
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert all(r["rewards/CalcEnv/mean"] == 1.0 and r["tools/call_frequency"] == 1.0 for r in rows)
    assert all(r["reward"] == 2.0 for r in rows)  # final_answer + the environment's own reward (weight 1)
    sample = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in sample["conversation"]] == ["assistant", "tool", "assistant"]
    assert sample["conversation"][1] == {"role": "tool", "name": "multiply", "content": "408"}


def test_a_rollout_function_trains_through_the_cli(rlvr_cli, tiny_model_dir, tmp_path):
    (tmp_path / "roll.py").write_text(ROLLOUT_FN)
    out = tmp_path / "run"
    rlvr_cli(
        "train",
        f"output_dir={out}",
        f"model.path={tiny_model_dir}",
        f"rollout.function={tmp_path / 'roll.py'}:my_rollout",
        f"rewards=[{tmp_path / 'roll.py'}:saw_source]",
        "rollout.group_size=4",
        "rollout.prompts_per_step=2",
        "steps=2",
        "eval_before_after=false",
        "threads=1",
        "report_to=[]",
        "log_completions_every=1",
        check=True,
        timeout=300,
    )
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["completions/max_length"] == 3 for r in rows)  # the model's tokens, not the reply's
    assert (out / "final" / "model.safetensors").exists()


def test_the_report_shows_episodes_as_conversations(tmp_path):
    from rlvr.observe.report import make_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": 0.5, "loss": 0.1}) + "\n" for s in (1, 2)))
    conv = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"expression": "12*34"}}}],
        },
        {"role": "tool", "name": "multiply", "content": "error: <boom>"},
        {"role": "assistant", "content": "408"},
    ]
    (run / "samples.jsonl").write_text(
        json.dumps({"step": 2, "prompt": "12*34=", "completion": "x", "conversation": conv, "reward/final_answer": 1.0, "advantage": 0.5})
        + "\n"
    )
    page = make_report([run]).read_text()
    assert "<div class=tool><span class=dim>tool result (multiply)</span><pre>error: &lt;boom&gt;</pre></div>" in page
    assert "[tool call] multiply({&quot;expression&quot;: &quot;12*34&quot;})" in page
