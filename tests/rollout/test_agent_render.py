"""Rendering an outside agent's messages (rlvr.rollout.sources.agent.render): the episode's own replies
become the exact ids recorded for them (never their text re-tokenized), so an unchanged history
continues the previous call token for token; a rewritten reply is rendered from its text and does not;
replies' Hermes tool calls become OpenAI tool_calls, and only for templates that render tools."""

from __future__ import annotations

import json

from _callers import hermes_tokenizer
from rlvr.models.loading import load_tokenizer
from rlvr.rollout.sources.agent.calls import Call, EpisodeLog
from rlvr.rollout.sources.agent.render import ChatRenderer

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "c", "parameters": {"type": "object", "properties": {}}}}]
USER = {"role": "user", "content": "12*34="}


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _answered(log, r, messages, prompt, sampled, k, parse=True):
    msg, text = r.reply(sampled, (), parse, f"call_e_{k}_0")
    log.record(Call(k, prompt, sampled, [-1.0] * len(sampled), "stop", messages, msg, None, text, r.full_text(sampled)))
    return msg


def test_an_unchanged_history_continues_the_previous_call_with_the_recorded_ids():
    tok = hermes_tokenizer()
    r, log = ChatRenderer(tok), EpisodeLog("e", 0)
    p1, n = r.prompt_ids([USER], TOOLS, log)
    assert p1 == _ids(tok, tok.apply_chat_template([USER], tools=TOOLS, add_generation_prompt=True, tokenize=False)) and n == 0
    # ids the tokenizer would never give for the reply's text: the log's ids are used, not the text's
    sampled = _ids(tok, "4") + _ids(tok, "2") * 3 + [tok.eos_token_id]
    msg = _answered(log, r, [USER], p1, sampled, 0)
    assert msg == {"role": "assistant", "content": "4222"}
    log.calls[0].sampled_ids = odd = _ids(tok, "x") + [tok.eos_token_id]  # as if "x" had been sampled for "4222"
    follow = {"role": "user", "content": "and?"}
    p2, n = r.prompt_ids([USER, {"role": "assistant", "content": "4222"}, follow], TOOLS, log)
    assert n == 1 and p2 == p1 + odd + _ids(tok, "\n<|im_start|>user\nand?<|im_end|>\n<|im_start|>assistant\n")


def test_tool_calls_are_parsed_and_the_message_sent_back_maps_to_its_tokens():
    tok = hermes_tokenizer()
    r, log = ChatRenderer(tok), EpisodeLog("e", 0)
    p1, _ = r.prompt_ids([USER], TOOLS, log)
    text = 'ok <tool_call>{"name": "calc", "arguments": {"expression": "12*34"}}</tool_call>'
    sampled = _ids(tok, text) + [tok.eos_token_id]
    msg = _answered(log, r, [USER], p1, sampled, 0)
    assert msg["content"] == "ok" and msg["tool_calls"] == [
        {"id": "call_e_0_0_0", "type": "function", "function": {"name": "calc", "arguments": json.dumps({"expression": "12*34"})}}
    ]
    sent = {
        **msg,
        "content": None,
        "tool_calls": [{**msg["tool_calls"][0], "function": {"name": "calc", "arguments": '{"expression":"12*34"}'}}],
    }
    result = {"role": "tool", "tool_call_id": "call_e_0_0_0", "content": "408"}
    p2, n = r.prompt_ids([USER, sent, result], TOOLS, log)
    glue = "\n<|im_start|>user\n<tool_response>408</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert n == 1 and p2 == p1 + sampled + _ids(tok, glue)
    # without tools offered (or tool_choice none) the same text is plain content
    assert r.reply(sampled, (), False, "c") == ({"role": "assistant", "content": text}, text)


def test_a_rewritten_reply_is_rendered_from_its_text_and_does_not_continue():
    tok = hermes_tokenizer()
    r, log = ChatRenderer(tok), EpisodeLog("e", 0)
    p1, _ = r.prompt_ids([USER], None, log)
    sampled = _ids(tok, "408") + [tok.eos_token_id]
    _answered(log, r, [USER], p1, sampled, 0)
    rewritten = [USER, {"role": "assistant", "content": "408."}, {"role": "user", "content": "sure?"}]
    p2, n = r.prompt_ids(rewritten, None, log)
    assert n == 0 and p2 == _ids(tok, tok.apply_chat_template(rewritten, add_generation_prompt=True, tokenize=False))
    assert p2[: len(p1) + len(sampled)] != p1 + sampled


def test_a_reply_cut_by_its_budget_keeps_the_templates_end_of_turn_as_context():
    """No EOS was sampled: the end-of-turn the template writes after the reply is context, after the sampled ids."""
    tok = hermes_tokenizer()
    r, log = ChatRenderer(tok), EpisodeLog("e", 0)
    p1, _ = r.prompt_ids([USER], None, log)
    sampled = _ids(tok, "40")
    _answered(log, r, [USER], p1, sampled, 0)
    p2, n = r.prompt_ids([USER, {"role": "assistant", "content": "40"}, {"role": "user", "content": "?"}], None, log)
    assert n == 1 and p2 == p1 + sampled + _ids(tok, "<|im_end|>\n<|im_start|>user\n?<|im_end|>\n<|im_start|>assistant\n")


def test_a_template_without_tools_returns_plain_content():
    """The bundled tiny-tools model's template has no place for tools: no tool_calls are made up, whatever the text."""
    tok, _ = load_tokenizer("tiny-tools")
    r = ChatRenderer(tok)
    assert not r.tools_in_template
    text = '<tool_call>{"name": "calc", "arguments": {}}</tool_call>'
    assert r.reply(_ids(tok, text) + [tok.eos_token_id], (), True, "c") == ({"role": "assistant", "content": text}, text)
    assert r.reply(_ids(tok, "<calc>1*2</calc>"), ("</calc>",), True, "c")[1] == "<calc>1*2"  # the stop string is left out


def test_the_developer_role_renders_as_the_system_message():
    """OpenAI's newer `developer` role (agent SDKs send it) is what chat templates call `system`."""
    tok = hermes_tokenizer()
    r = ChatRenderer(tok)
    as_developer, _ = r.prompt_ids([{"role": "developer", "content": "Be brief."}, USER], None, EpisodeLog("e", 0))
    as_system, _ = r.prompt_ids([{"role": "system", "content": "Be brief."}, USER], None, EpisodeLog("e", 1))
    assert as_developer == as_system and "Be brief." in tok.decode(as_system)
