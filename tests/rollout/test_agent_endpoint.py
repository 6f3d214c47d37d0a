"""The outside-agent endpoint (rlvr.rollout.sources.agent) driven by the real `openai` client: many
concurrent episodes of a plain calculator loop on a real tiny tool-calling model, batched into
shared decodes, every call recorded token-exactly; history rewriting splits an episode and is
counted; the key is enforced; completions continue their own earlier tokens."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch

from _callers import hermes_tokenizer, train_caller
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.engines.hf.continuous import ContinuousDecoder
from rlvr.rollout.engines.remote.protocol import GenerateRequest
from rlvr.rollout.engines.turns import eos_ids
from rlvr.rollout.sources.agent import AgentEndpoint, call_seed, engine_sampler

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate a+b or a*b.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
        },
    }
]
QUESTION = "12*34+1="


def calc(expression: str) -> str:
    for op, fn in (("*", lambda a, b: a * b), ("+", lambda a, b: a + b)):
        a, _, b = expression.partition(op)
        if a.strip().isdigit() and b.strip().isdigit():
            return str(fn(int(a), int(b)))
    return "error: cannot evaluate"


@pytest.fixture(scope="module")
def caller():
    """A tiny Llama with a Hermes-style template that calls calc twice (12*34, then 408+1) and answers 409."""
    tok = hermes_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": QUESTION}], tools=TOOLS, add_generation_prompt=True, tokenize=False)
    call = lambda e: '<tool_call>{"name": "calc", "arguments": {"expression": "%s"}}</tool_call><|im_end|>' % e  # noqa: E731
    glue = lambda r: f"\n<|im_start|>user\n<tool_response>{r}</tool_response><|im_end|>\n<|im_start|>assistant\n"  # noqa: E731
    episode = [(prompt, False), (call("12*34"), True), (glue("408"), False), (call("408+1"), True), (glue("409"), False)]
    model, loss = train_caller(tok, [episode + [("409<|im_end|>", True)]], steps=200, max_positions=512)
    assert loss < 0.02
    return model, tok


class CountingSampler:
    """engine_sampler on the hf engine, remembering every request and its samples."""

    def __init__(self, model, tok):
        self.inner = engine_sampler(HFEngine(model, tok), tok)
        self.requests, self.lock = [], threading.Lock()

    def __call__(self, req):
        out = self.inner(req)
        with self.lock:
            self.requests.append((req, out))
        return out

    def sampled(self, seed):
        """The ids and log-probs the engine returned for the prompt seeded `seed`."""
        (hit,) = [(s.ids, s.logprobs) for req, out in self.requests for sd, per in zip(req.seeds, out) if sd == seed for s in per]
        return hit


def calculator_agent(base_url: str, api_key: str, calls: int = 3) -> list:
    """A plain openai-client tool loop: tool calls run and their results go back; a reply without calls gets a nudge."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list = [{"role": "user", "content": QUESTION}]
    replies = []
    for _ in range(calls):
        r = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=96, logprobs=True)
        replies.append(r)
        msg = r.choices[0].message
        messages.append(msg)  # the message object as returned, as agents append it
        for tc in msg.tool_calls or []:
            args = json.loads(tc.function.arguments)
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": calc(str(args.get("expression", "")))})
        if not msg.tool_calls:
            messages.append({"role": "user", "content": "go on"})
    return replies


def _expected_layout(calls):
    """The sequence the calls make when each continues the last: ids, mask and log-probs built from the calls alone."""
    ids, mask, lps = [], [], []
    for c in calls:
        assert c.prompt_ids[: len(ids)] == ids, "each call's prompt continues the previous prompt + sampled ids"
        gap = len(c.prompt_ids) - len(ids)
        ids = c.prompt_ids + c.sampled_ids
        mask += [0] * gap + [1] * len(c.sampled_ids)
        lps += [0.0] * gap + c.logprobs
    return ids, mask, lps


def test_a_driven_endpoint_samples_batched_on_the_driving_thread(caller):
    """driven=True (the trainer's agents): the Batcher has no thread; drive() batches and samples on the caller's thread
    until `until()` holds, with the samples its own thread would give."""
    model, tok = caller
    own, driven = CountingSampler(model, tok), CountingSampler(model, tok)
    threads: list[int] = []
    real = driven.__call__
    driven_call = lambda req: (threads.append(threading.get_ident()), real(req))[1]  # noqa: E731
    replies = {}
    for name, sample, is_driven in (("own", own, False), ("driven", driven_call, True)):
        with AgentEndpoint(sample, tok, max_tokens=96, context_length=512, batch_wait=0.05, driven=is_driven) as ep:
            logs = [ep.open_episode(seed=100 + i) for i in range(8)]
            with ThreadPoolExecutor(8) as pool:
                done = [pool.submit(calculator_agent, ep.base_url(log.episode), ep.api_key, 2) for log in logs]
                ep.batcher.drive(lambda: all(f.done() for f in done))  # noqa: B023 - called before the loop moves on
                replies[name] = [[c.sampled_ids for c in log.snapshot()] for log in logs if [f.result() for f in done]]
            for log in logs:
                ep.close_episode(log.episode)
    assert threads and set(threads) == {threading.get_ident()}
    assert len(driven.requests) < 16  # batched: fewer decodes than the 16 calls
    assert replies["driven"] == replies["own"] and all(len(r) == 2 for r in replies["own"])


def test_32_concurrent_episodes_are_batched_and_recorded_token_exactly(caller):
    model, tok = caller
    sampler = CountingSampler(model, tok)
    with AgentEndpoint(sampler, tok, max_tokens=96, context_length=512, batch_wait=0.05) as ep:
        logs = [ep.open_episode(seed=100 + i) for i in range(32)]
        with ThreadPoolExecutor(32) as pool:
            replies = list(pool.map(lambda log: calculator_agent(ep.base_url(log.episode), ep.api_key), logs))
        for log in logs:
            ep.close_episode(log.episode)
    requests = sum(len(r) for r in replies)
    assert requests == 96 and sum(len(req.seeds) for req, _ in sampler.requests) == 96
    assert len(sampler.requests) <= requests // 4, f"{len(sampler.requests)} decodes for {requests} requests: not batched"
    tool_calls = 0
    for log, rs in zip(logs, replies):
        calls = log.snapshot()
        assert [c.index for c in calls] == [0, 1, 2]
        for c, r in zip(calls, rs):
            assert (c.sampled_ids, c.logprobs) == sampler.sampled(call_seed(log.seed, c.index))  # the engine's ids, as sampled
            assert [t.logprob for t in r.choices[0].logprobs.content] == c.logprobs  # what the agent was told
            assert r.usage.prompt_tokens == len(c.prompt_ids) and r.usage.completion_tokens == len(c.sampled_ids)
            tool_calls += c.tool_calls
        (seq,) = log.sequences()
        assert (seq.ids, seq.mask, seq.logprobs) == _expected_layout(calls)
        assert seq.calls == [0, 1, 2] and log.splits() == 0
    assert tool_calls >= 32  # the model calls calc: replies were parsed into tool_calls and their results sent back
    first = replies[0][0].choices[0]
    assert first.finish_reason == "tool_calls" or not first.message.tool_calls


def test_32_concurrent_episodes_through_the_continuous_decoder(caller):
    """The hf engine's scheduler: requests join the running decode and each episode's later calls feed only their new
    tokens; every call's reply is what engine.generate samples for its prompt and seed."""
    model, tok = caller
    decoder = ContinuousDecoder(model, tok, eos=eos_ids(model, tok))
    with AgentEndpoint(None, tok, max_tokens=96, context_length=512, scheduler=decoder) as ep:
        logs = [ep.open_episode(seed=500 + i) for i in range(32)]
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda log: calculator_agent(ep.base_url(log.episode), ep.api_key), logs))
        for log in logs:
            ep.close_episode(log.episode)
    calls = [c for log in logs for c in log.snapshot()]
    assert len(calls) == 96 and all(len(log.sequences()) == 1 for log in logs)
    # each episode's first prompt once; then per call its sampled tokens but the last, and what the next call adds
    # (the previous reply's last token, the tool result, the template's glue): no history is run again
    fed = 0
    for log in logs:
        c = log.snapshot()
        fed += len(c[0].prompt_ids) + sum(len(x.sampled_ids) - 1 for x in c)
        fed += sum(len(b.prompt_ids) - len(a.prompt_ids) - len(a.sampled_ids) + 1 for a, b in zip(c, c[1:]))
    assert decoder.tokens_fed == fed < sum(len(c.prompt_ids) for c in calls)  # each call prefilled anew: all of them
    seeds = [call_seed(log.seed, c.index) for log in logs for c in log.snapshot()]
    req = GenerateRequest(prompt_ids=[c.prompt_ids for c in calls], n=1, seeds=seeds, max_tokens=[96] * 96, temperature=1.0, top_p=1.0)
    want = engine_sampler(HFEngine(model, tok), tok)(req)
    for c, (w,) in zip(calls, want):  # log-probs: two fp32 attention kernels over prompts of up to ~400 tokens (measured <= 5e-5)
        assert c.sampled_ids == w.ids
        torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-4)


def test_a_history_rewriting_agent_makes_split_sequences_and_counts_them(caller):
    model, tok = caller
    with AgentEndpoint(CountingSampler(model, tok), tok, max_tokens=32, context_length=512) as ep:
        log = ep.open_episode(seed=7)
        client = openai.OpenAI(base_url=ep.base_url(log.episode), api_key=ep.api_key, max_retries=0)
        ask = lambda msgs: client.chat.completions.create(model="policy", messages=msgs, max_tokens=32).choices[0].message  # noqa: E731
        ask([{"role": "user", "content": QUESTION}])
        summary = [{"role": "user", "content": QUESTION}, {"role": "user", "content": "calc said 408"}]  # the first exchange summarised
        reply = ask(summary)
        ask(summary + [reply, {"role": "user", "content": "go on"}])  # continues the rewritten history
        ep.close_episode(log.episode)
    seqs = log.sequences()
    assert [s.calls for s in seqs] == [[0], [1, 2]] and log.splits() == 1
    calls = log.snapshot()
    assert seqs[0].ids == calls[0].prompt_ids + calls[0].sampled_ids
    assert (seqs[1].ids, seqs[1].mask, seqs[1].logprobs) == _expected_layout(calls[1:])


def test_requests_need_the_key_and_an_open_episode(caller):
    model, tok = caller
    with AgentEndpoint(CountingSampler(model, tok), tok, model_name="calc-policy") as ep:
        log = ep.open_episode(seed=0)
        base = ep.base_url(log.episode)
        with pytest.raises(openai.AuthenticationError, match="Bearer"):
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).chat.completions.create(
                model="x", messages=[{"role": "user", "content": "hi"}]
            )
        raw = urllib.request.Request(f"{base}/chat/completions", data=b"{}", headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as no_key:
            urllib.request.urlopen(raw, timeout=10)
        assert no_key.value.code == 401
        client = openai.OpenAI(base_url=base, api_key=ep.api_key, max_retries=0)
        assert [m.id for m in client.models.list()] == ["calc-policy"]
        with pytest.raises(openai.BadRequestError, match="top_logprobs"):
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=2)
        ep.close_episode(log.episode)
        with pytest.raises(openai.NotFoundError, match="is not open"):
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
        assert log.requests == 0  # nothing refused was sampled or recorded


def test_text_completions_cut_at_stop_strings_and_continue_their_own_tokens():
    """The bundled tiny-tools model through /v1/completions (greedy): a stop string ends the reply (left out of
    its text, its tokens kept); a prompt that continues an earlier completion's text is that completion's exact
    ids + the new text, and the calls make one sequence."""
    from rlvr.models.loading import load_model, load_tokenizer

    tok, _ = load_tokenizer("tiny-tools")
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    with AgentEndpoint(engine_sampler(HFEngine(load_model("tiny-tools"), tok), tok), tok, max_tokens=24) as ep:
        log = ep.open_episode(seed=1)
        client = openai.OpenAI(base_url=ep.base_url(log.episode), api_key=ep.api_key, max_retries=0)
        prompt = "<|user|>123*45=<|assistant|>"
        plain = client.completions.create(model="policy", prompt=prompt, temperature=0, max_tokens=8).choices[0].text
        assert len(plain) >= 3
        stop = plain[1:3]
        stopped = client.completions.create(model="policy", prompt=prompt, stop=[stop], temperature=0, logprobs=0).choices[0]
        assert stopped.text == plain[: plain.find(stop)] and stopped.finish_reason == "stop"
        then = client.completions.create(model="policy", prompt=prompt + stopped.text + stop + "<result>5535</result>", temperature=0)
        ep.close_episode(log.episode)
    _, b, c = log.snapshot()
    assert b.sampled_ids == ids(plain[: plain.find(stop) + len(stop)])  # the tokens up to the one completing the stop
    assert stopped.logprobs.token_logprobs == b.logprobs
    assert c.prompt_ids == b.prompt_ids + b.sampled_ids + ids("<result>5535</result>")
    assert then.choices[0].text == tok.decode(c.sampled_ids, skip_special_tokens=True)
    seqs = log.sequences()
    assert [s.calls for s in seqs] == [[0], [1, 2]]  # the second call restarted from the prompt: a split
    assert seqs[1].mask == [0] * len(b.prompt_ids) + [1] * len(b.sampled_ids) + [0] * len(ids("<result>5535</result>")) + [1] * len(
        c.sampled_ids
    )


def test_sampler_errors_reach_the_agent_and_the_endpoint_goes_on():
    """A sampler that fails once (a scripted one: this checks the endpoint's paths, not the model): the agent gets a
    500 naming the error, the next request is served; n choices are recorded apart; budgets are capped."""
    from rlvr.rollout.engines.remote.protocol import Sample

    tok = hermes_tokenizer()
    seen = []

    def sample(req):
        seen.append(req)
        if len(seen) == 1:
            raise RuntimeError("the decode ran out of memory")
        return [
            [Sample(tok(f"hi{j}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id], [-0.5] * 4, "stop") for j in range(req.n)]
            for _ in req.seeds
        ]

    with AgentEndpoint(sample, tok, max_tokens=16, context_length=64) as ep:
        log = ep.open_episode(seed=5)
        client = openai.OpenAI(base_url=ep.base_url(log.episode), api_key=ep.api_key, max_retries=0)
        hi = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.InternalServerError, match="RuntimeError: the decode ran out of memory"):
            client.chat.completions.create(model="policy", messages=hi)
        r = client.chat.completions.create(model="policy", messages=hi, n=2, max_tokens=500, temperature=0.5, stop="x")
        assert [c.message.content for c in r.choices] == ["hi0", "hi1"] and [c.finish_reason for c in r.choices] == ["stop", "stop"]
        with pytest.raises(openai.BadRequestError, match="no room for a reply"):
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x" * 80}])
    req = seen[1]
    assert (req.n, req.max_tokens, req.temperature, req.stop_strings, req.seeds) == (2, [16], 0.5, ["x"], [call_seed(5, 1)])
    assert [(c.index, c.text) for c in log.snapshot()] == [(1, "hi0"), (1, "hi1")] and len(log.sequences()) == 2


def test_streamed_replies_join_into_the_unstreamed_ones(caller):
    """`stream: true` (agent frameworks stream): the joined deltas are the message, tool calls and finish reason that the
    same request without streaming gets; the call is recorded the same way; usage comes last when asked."""
    model, tok = caller
    with AgentEndpoint(CountingSampler(model, tok), tok, max_tokens=96, context_length=512) as ep:
        logs = [ep.open_episode(seed=42) for _ in range(2)]  # same seed: the same sample
        plain, streamed = (openai.OpenAI(base_url=ep.base_url(log.episode), api_key=ep.api_key, max_retries=0) for log in logs)
        ask = dict(model="policy", messages=[{"role": "user", "content": QUESTION}], tools=TOOLS, max_tokens=96)
        want = plain.chat.completions.create(**ask).choices[0]
        chunks = list(streamed.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
        text = plain.completions.create(model="policy", prompt="12*34=", max_tokens=8, seed=3).choices[0]
        completion = list(streamed.completions.create(model="policy", prompt="12*34=", max_tokens=8, seed=3, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert want.message.tool_calls and content == (want.message.content or "") and finish == [want.finish_reason]
    assert [(tc.id, tc.function.name, tc.function.arguments) for tc in calls] == [
        (tc.id.replace(logs[0].episode, logs[1].episode), tc.function.name, tc.function.arguments) for tc in want.message.tool_calls
    ]
    assert chunks[-1].usage.completion_tokens == len(logs[1].snapshot()[0].sampled_ids) and not chunks[-1].choices
    assert logs[0].snapshot()[0].sampled_ids == logs[1].snapshot()[0].sampled_ids
    assert "".join(c.choices[0].text for c in completion) == text.text and completion[-1].choices[0].finish_reason == text.finish_reason
