"""Chat messages -> prompt token ids, with the episode's own replies as the exact tokens sampled;
and the model's sampled tokens -> an OpenAI assistant message.

Rendering: every assistant message the endpoint wrote for this episode (found in its EpisodeLog by
its tool calls' ids, else by its exact content) is replaced by a sentinel before the chat template
runs; the rendered text is then tokenized piece by piece between the sentinels, and each sentinel
becomes the reply's recorded token ids. When the reply ended with EOS, the end-of-turn text the
template writes after the sentinel is the EOS already in those ids, so it is dropped from the
next piece. An unchanged history therefore renders to the previous call's prompt + sampled ids +
the new text, token for token (the template's generation prompt is its assistant header, as in
any prefix-preserving template); a rewritten history does not, and the log counts a split.

Replies: for chat templates that render `tools=` (rlvr.tools.chat_template.template_supports_tools),
tool calls are read from the reply in the Hermes format (`<tool_call>{json}</tool_call>`,
rlvr.tools.formats.HermesFormat) into OpenAI `tool_calls` with ids; the content is the text
before the first call. For other templates (no place for tools, e.g. the bundled tiny-tools
model, which uses tags) the reply is plain content and the agent reads its own format from it
(or drives the model through /v1/completions).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from rlvr.rollout.sources.agent.calls import Call, EpisodeLog
from rlvr.tools.chat_template import template_supports_tools
from rlvr.tools.formats import HermesFormat


def sentinel(i: int) -> str:
    return f"\ue000rlvr-reply-{i}\ue001"  # private-use characters: no template or agent writes them


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """The text before its first stop string (OpenAI leaves the stop string out of the reply)."""
    starts = [i for s in stops if s and (i := text.find(s)) >= 0]
    return text[: min(starts)] if starts else text


def _text(content: Any) -> str:
    """OpenAI content: a string, None, or a list of parts ({"type": "text", "text": ...})."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise ValueError(f"message content must be a string or a list of text parts, got {type(content).__name__}")


def _template_call(tc: dict) -> dict:
    """An OpenAI tool call as chat templates expect it: arguments as a dict, not a JSON string."""
    fn = dict(tc.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except ValueError:
            pass  # not JSON: the template shows the string as it is
    return {"type": "function", "id": tc.get("id"), "function": fn}


def normalize(messages: list[dict]) -> list[dict]:
    """The messages as chat templates expect them: text content, tool-call arguments as dicts,
    tool messages named after the call they answer; keys set to None dropped."""
    names = {tc.get("id"): (tc.get("function") or {}).get("name") for m in messages for tc in m.get("tool_calls") or []}
    out = []
    for m in messages:
        n = {k: v for k, v in m.items() if v is not None}
        n["content"] = _text(m.get("content"))
        if m.get("tool_calls"):
            n["tool_calls"] = [_template_call(tc) for tc in m["tool_calls"]]
        if m.get("role") == "tool" and "name" not in n and names.get(m.get("tool_call_id")):
            n["name"] = names[m.get("tool_call_id")]
        out.append(n)
    return out


class ChatRenderer:
    """The chat template of one tokenizer, rendering with recorded replies and parsing replies."""

    def __init__(self, tokenizer, **template_kwargs):
        self.tokenizer, self.template_kwargs = tokenizer, template_kwargs
        self.eos_id = tokenizer.eos_token_id
        self.eot = tokenizer.convert_ids_to_tokens(self.eos_id)  # the text a template writes for EOS
        self.tools_in_template = template_supports_tools(tokenizer, **template_kwargs)
        self.hermes = HermesFormat()

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def _render(self, messages: list[dict], tools: list[dict] | None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=False, **self.template_kwargs
        )

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None, log: EpisodeLog) -> tuple[list[int], int]:
        """(the prompt's token ids, how many assistant messages were the episode's own replies)."""
        shown = normalize(messages)
        known = {i: c for i, m in enumerate(shown) if m.get("role") == "assistant" and (c := log.find_reply(m, i)) is not None}
        while True:
            text = self._render([{"role": "assistant", "content": sentinel(i)} if i in known else m for i, m in enumerate(shown)], tools)
            lost = [i for i in known if text.count(sentinel(i)) != 1]  # a template that drops or repeats old turns
            if not lost:
                return self._assemble(text, known), len(known)
            for i in lost:
                del known[i]

    def _assemble(self, text: str, known: dict[int, Call]) -> list[int]:
        ids: list[int] = []
        pos = 0
        for i in sorted(known, key=lambda i: text.index(sentinel(i))):
            at = text.index(sentinel(i))
            ids += self._ids(text[pos:at]) + list(known[i].sampled_ids)
            pos = at + len(sentinel(i))
            ended = bool(known[i].sampled_ids) and known[i].sampled_ids[-1] == self.eos_id
            end = text.find(self.eot, pos) if ended else -1
            if end >= 0 and not text[pos:end].strip():  # the template's end of turn: the sampled EOS
                pos = end + len(self.eot)
        return ids + self._ids(text[pos:])

    def reply(self, sampled_ids: list[int], stops: Sequence[str], parse_tools: bool, call_id: str) -> tuple[dict, str]:
        """(the OpenAI assistant message, the text returned) for sampled ids. Tool calls are parsed when
        `parse_tools` (the request offered tools) and the template renders tools; `call_id` prefixes their ids."""
        text = self.text(sampled_ids, stops)
        calls = [c for c in self.hermes.parse(text) if c.error is None] if parse_tools and self.tools_in_template else []
        if not calls:
            return {"role": "assistant", "content": text}, text
        content = text.split(self.hermes.open_tag, 1)[0].strip() or None
        tool_calls = [
            {
                "id": f"{call_id}_{j}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)},
            }
            for j, c in enumerate(calls)
        ]
        return {"role": "assistant", "content": content, "tool_calls": tool_calls}, text

    def text(self, ids: list[int], stops: Sequence[str]) -> str:
        """What a reply's text is: special tokens left out, cut before the first stop string."""
        return cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), stops)

    def full_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def completion_prompt(self, prompt: str | list[int], log: EpisodeLog) -> tuple[list[int], str | None]:
        """(ids, text or None) of a /v1/completions prompt: ids as sent; text continuing an earlier completion
        of the episode as that completion's exact ids + the new text tokenized, else tokenized whole."""
        if not isinstance(prompt, str):
            return list(prompt), None
        prev = log.find_completion(prompt)
        if prev is None or prev.prompt_text is None:
            return self._ids(prompt), prompt
        done = prev.prompt_text + prev.full_text
        return list(prev.prompt_ids) + list(prev.sampled_ids) + self._ids(prompt[len(done) :]), prompt
