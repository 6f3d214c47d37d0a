"""Outside training, the same tag protocol: `rlvr serve MODEL --tool-tags calculator=calc` answers the `openai`
client with tool calls parsed from `<calc>..</calc>` and renders results back into the same assistant turn, and
`rlvr eval --agent` evaluates the example agent on a tag model (a tool task's tags, or the flags)."""

from __future__ import annotations

import json

import openai
import pytest

from _paths import REPO
from _servers import Server
from rlvr.models.loading import load_tokenizer
from rlvr.tools import ToolSet

EXAMPLE = f"{REPO / 'examples' / 'agent_openai.py'}:calculator_agent"
TOOLS = ToolSet(["calculator"]).schemas


@pytest.fixture(scope="module")
def server():
    s = Server("tiny-tools", "--tool-tags", "calculator=calc", "--no-tool-describe").wait()
    yield s
    s.kill()


def test_rlvr_serve_speaks_the_models_tags(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    user = {"role": "user", "content": "845*109="}
    first = client.chat.completions.create(model="tiny-tools", messages=[user], tools=TOOLS, n=64, max_tokens=32)
    calls = [c for c in first.choices if c.message.tool_calls]
    assert calls, [c.message.content for c in first.choices]  # tiny-tools calls in about 1 of 5 samples: none of 64 has odds ~1e-7
    call = calls[0]
    assert call.finish_reason == "tool_calls" and call.message.tool_calls[0].function.name == "calculator"
    assert set(json.loads(call.message.tool_calls[0].function.arguments)) == {"expression"}
    # the result goes back: one assistant turn, continued (rendered from text: each request is its own episode here)
    asked = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": json.dumps({"expression": "845*109"})}}
    result = {"role": "tool", "tool_call_id": "c1", "content": "92105"}
    history = [user, {"role": "assistant", "content": None, "tool_calls": [asked]}, result]
    reply = client.chat.completions.create(model="tiny-tools", messages=history, tools=TOOLS, temperature=0, max_tokens=8)
    text = "<|user|>845*109=<|assistant|><calc>845*109</calc><result>92105</result>"
    assert reply.usage.prompt_tokens == len(load_tokenizer("tiny-tools")[0](text, add_special_tokens=False)["input_ids"])
    assert reply.choices[0].message.content == "92105" and reply.choices[0].finish_reason == "stop"


def test_rlvr_serve_refuses_a_tag_flag_that_is_no_pair(rlvr_cli):
    bad = rlvr_cli("serve", "tiny-tools", "--tool-tags", "calc", timeout=60)
    assert bad.returncode == 2 and "rlvr serve: --tool-tags takes TOOL=TAG pairs (e.g. calculator=calc), got calc" in bad.stderr
    vllm = rlvr_cli("serve", "tiny-tools", "--engine", "vllm", "--tool-tags", "calculator=calc", timeout=60)
    assert vllm.returncode == 2 and "rlvr serve: --tool-tags is for --engine hf" in vllm.stderr


def test_rlvr_eval_runs_the_example_agent_in_a_tool_tasks_tags(rlvr_cli):
    ok = rlvr_cli("eval", "tiny-tools", "--task", "multiplication", "--n", "8", "--agent", EXAMPLE, "--no-tool-describe", timeout=180)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "episodes run by rollout.agent" in ok.stdout and "tool calls in tags calculator=calc" in ok.stdout
    line = ok.stdout.strip().splitlines()[-1]
    assert line.startswith("multiplication held-out") and "(8 problems, the agent's sampling): " in line
    assert 0.0 <= float(line.rsplit(" ", 1)[1]) <= 1.0
    bad = rlvr_cli("eval", "tiny-tools", "--task", "arithmetic", "--n", "2", "--agent", EXAMPLE, "--tool-format", "tags", timeout=120)
    assert bad.returncode == 2 and "`rollout.agent` with tools.format=tags needs tools.tags" in bad.stderr
