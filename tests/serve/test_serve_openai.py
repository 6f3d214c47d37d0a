"""`rlvr serve --engine hf` answers OpenAI's API: the official `openai` client talks to it, the example agent of
`rollout.agent` runs against it unchanged, and with a token the client must send it."""

from __future__ import annotations

import sys

import openai
import pytest

from _paths import REPO
from _servers import Server


@pytest.fixture(scope="module")
def server():
    s = Server("tiny", "--api-key", "k3y").wait()
    yield s
    s.kill()


def test_the_openai_client_talks_to_rlvr_serve(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k3y", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "12+7="}], max_tokens=5, logprobs=True)
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length") and reply.usage.completion_tokens <= 5
    assert len(choice.logprobs.content) == reply.usage.completion_tokens
    text = client.completions.create(model="tiny", prompt="3*4=", max_tokens=3, temperature=0)
    assert text.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    ask = dict(model="tiny", messages=[{"role": "user", "content": "Tell me about 12+7="}], max_tokens=24, seed=11)
    whole = client.chat.completions.create(**ask).choices[0]
    chunks = list(client.chat.completions.create(**ask, stream=True))  # an agent framework that streams
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.message.content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    assert whole.message.content == client.chat.completions.create(**ask).choices[0].message.content  # `seed`: the same reply
    assert whole.message.content != client.chat.completions.create(**{**ask, "seed": 12}).choices[0].message.content


def test_the_example_agent_runs_against_rlvr_serve_unchanged(server):
    sys.path.insert(0, str(REPO / "examples"))
    try:
        from agent_openai import calculator_agent
    finally:
        sys.path.pop(0)
    reward = calculator_agent({"prompt": "What is 12+7?", "answer": "19"}, server.url + "/v1", "tiny", "k3y")
    assert reward in (0.0, 1.0)
