"""The agent endpoint speaking a model's tag protocol (rlvr.rollout.sources.agent.tags): a reply ending in
`<calc>..</calc>` is an OpenAI tool call; the call, its results and the next reply render as ONE assistant turn
whose ids are the sampled ones with `<result>..</result>` between, as rlvr's `tools:` path builds the episode;
a later user message closes that turn; messages the endpoint did not write render from their text."""

from __future__ import annotations

import json

import pytest

from rlvr.models.loading import load_tokenizer
from rlvr.rollout.sources.agent.api import BadRequest
from rlvr.rollout.sources.agent.calls import Call, EpisodeLog
from rlvr.rollout.sources.agent.render import ChatRenderer
from rlvr.rollout.sources.agent.tags import TagSettings, arguments
from rlvr.tools import ToolSet

TOOLS = ToolSet(["calculator"]).schemas  # the schema the `tools:` path describes: the same description either way
USER = {"role": "user", "content": "845*109="}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-tools")[0]


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _answer(r, log, messages, sampled, k, tools=TOOLS):
    prompt, _ = r.prompt_ids(messages, tools, log)
    msg, text = r.reply(sampled, (), True, f"call_e_{k}", tools)
    log.record(Call(k, prompt, sampled, [-1.0] * len(sampled), "stop", messages, msg, None, text, r.full_text(sampled)))
    return prompt, msg


def test_a_closing_tag_is_a_tool_call_with_the_schemas_parameter(tok):
    r = ChatRenderer(tok, TagSettings({"calculator": "calc"}))
    assert r.call_stops(TOOLS, True) == ("</calc>",) and r.call_stops(TOOLS, False) == ()
    msg, text = r.reply(_ids(tok, "ok <calc>845*109</calc>"), (), True, "c", TOOLS)
    assert text == "ok <calc>845*109</calc>"
    assert msg == {
        "role": "assistant",
        "content": "ok ",
        "tool_calls": [{"id": "c_0", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "845*109"}'}}],
    }
    # the request's own stop string first: plain content cut there, no call
    assert r.reply(_ids(tok, "9<calc>1*2</calc>"), ("<",), True, "c", TOOLS)[0] == {"role": "assistant", "content": "9"}
    # tools offered but tool_choice none: the text as it is
    assert r.reply(_ids(tok, "<calc>1*2</calc>"), (), False, "c", TOOLS)[0]["content"] == "<calc>1*2</calc>"


def test_several_parameters_take_the_tags_text_as_a_json_object():
    assert arguments('{"a": 1, "b": 2}', ["a", "b"]) == '{"a": 1, "b": 2}'
    assert arguments("not json", ["a", "b"]) == "not json"  # what the model wrote, for the agent to handle
    assert arguments("", []) == "{}" and arguments("12", ["x"]) == '{"x": "12"}'


def test_a_call_its_result_and_the_next_reply_are_one_turn_of_sampled_ids(tok):
    r, log = ChatRenderer(tok, TagSettings({"calculator": "calc"}, describe=False)), EpisodeLog("e", 0)
    s1 = _ids(tok, "<calc>845*109</calc>")
    p1, msg = _answer(r, log, [USER], s1, 0)
    assert p1 == _ids(tok, "<|user|>845*109=<|assistant|>")
    sent = msg | {"content": None}
    result = {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "92105"}
    # ids the tokenizer would never give for the reply's text: the recorded ids are what renders
    log.calls[0].sampled_ids = odd = s1[:-1] + _ids(tok, ">")
    p2, n = r.prompt_ids([USER, sent, result], TOOLS, log)
    assert n == 1 and p2 == p1 + odd + _ids(tok, "<result>92105</result>")  # the same turn: no end of turn, no header
    s2 = _ids(tok, "92105") + [tok.eos_token_id]
    _, final = _answer(r, log, [USER, sent, result], s2, 1)
    assert final == {"role": "assistant", "content": "92105"}
    more = {"role": "user", "content": "and 2*3?"}
    p3, n = r.prompt_ids([USER, sent, result, final, more], TOOLS, log)
    assert n == 2 and p3 == p2 + s2 + _ids(tok, "<|user|>and 2*3?<|assistant|>")  # the sampled EOS ends the turn
    log.record(Call(2, p3, [5], [-1.0], "stop", None, {"role": "assistant", "content": "x"}))
    (seq,) = log.sequences()
    result_ids, glue = _ids(tok, "<result>92105</result>"), len(p3) - len(p2) - len(s2)
    assert seq.ids == p3 + [5] and seq.mask == [0] * len(p1) + [1] * len(odd) + [0] * len(result_ids) + [1] * len(s2) + [0] * glue + [1]


def test_a_chain_closed_by_a_user_message_without_a_final_reply_keeps_the_templates_end_of_turn(tok):
    r, log = ChatRenderer(tok, TagSettings({"calculator": "calc"}, describe=False)), EpisodeLog("e", 0)
    s1 = _ids(tok, "<calc>845*109</calc>")
    p1, msg = _answer(r, log, [USER], s1, 0)
    result = {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "92105"}
    p2, n = r.prompt_ids([USER, msg, result, {"role": "user", "content": "ok?"}], TOOLS, log)
    assert n == 1 and p2 == p1 + s1 + _ids(tok, "<result>92105</result></s><|user|>ok?<|assistant|>")


def test_messages_the_endpoint_did_not_write_render_as_tag_text(tok):
    """`rlvr serve` (one request, one episode) or a rewritten call: the turn from its text, still continued."""
    r, log = ChatRenderer(tok, TagSettings({"calculator": "calc"}, describe=False)), EpisodeLog("e", 0)
    call = {"id": "x", "type": "function", "function": {"name": "calculator", "arguments": json.dumps({"expression": "2*3"})}}
    messages = [USER, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "x", "content": "6"}]
    p, n = r.prompt_ids(messages, TOOLS, log)
    assert n == 0 and p == _ids(tok, "<|user|>845*109=<|assistant|><calc>2*3</calc><result>6</result>")


def test_the_tools_description_goes_where_the_tools_path_puts_it(tok):
    """tools.describe=true: the request's tools described in the system prompt, as MultiTurnSource renders it."""
    from rlvr.rollout.sources.multi_turn import MultiTurnSource, make_format

    r, log = ChatRenderer(tok, TagSettings({"calculator": "calc"}, describe=True)), EpisodeLog("e", 0)
    tags = {"calculator": "calc"}
    fmt = make_format("tags", tok, tool_names=["calculator"], schemas=TOOLS, tags=tags, result_tags=("<result>", "</result>"))
    for system in (None, "Be brief."):
        tools_path = MultiTurnSource.__new__(MultiTurnSource)
        tools_path.tokenizer, tools_path.fmt, tools_path.system_prompt, tools_path.description = tok, fmt, system, fmt.describe(TOOLS)
        messages = ([{"role": "system", "content": system}] if system else []) + [USER]
        p, _ = r.prompt_ids(messages, TOOLS, log)
        assert p == _ids(tok, tools_path._render([USER])) and "calculator: <calc>expression</calc>" in tok.decode(p)


def test_a_tool_whose_name_is_no_tag_is_a_clear_400(tok):
    r = ChatRenderer(tok, TagSettings({}))
    bad = [{"type": "function", "function": {"name": "my tool", "parameters": {}}}]
    with pytest.raises(BadRequest, match=r"tag 'my tool' must be a plain name .*tools.tags / --tool-tags"):
        r.prompt_ids([USER], bad, EpisodeLog("e", 0))
