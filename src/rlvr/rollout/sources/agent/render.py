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
model) the reply is plain content, unless the endpoint is given the model's tag protocol
(tags.py, `tools.format=tags` + `tools.tags`): then `<calc>12*34</calc>` becomes a tool call, and a
call, its results and the next reply render as one assistant turn, as rlvr's `tools:` path builds it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from rlvr.rollout.engines.turns import cut_after_stop
from rlvr.rollout.sources.agent.calls import Call, EpisodeLog
from rlvr.rollout.sources.agent.tags import Chain, TagSettings, arguments, chains, params_of, results_text, tag_text
from rlvr.tools.chat_template import template_supports_tools
from rlvr.tools.formats import HermesFormat, TagFormat


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
    tool messages named after the call they answer, OpenAI's `developer` role as `system` (what
    chat templates know); keys set to None dropped."""
    names = {tc.get("id"): (tc.get("function") or {}).get("name") for m in messages for tc in m.get("tool_calls") or []}
    out = []
    for m in messages:
        n = {k: v for k, v in m.items() if v is not None}
        n["content"] = _text(m.get("content"))
        if n.get("role") == "developer":  # OpenAI's newer name for the system message (agent SDKs send it)
            n["role"] = "system"
        if m.get("tool_calls"):
            n["tool_calls"] = [_template_call(tc) for tc in m["tool_calls"]]
        if m.get("role") == "tool" and "name" not in n and names.get(m.get("tool_call_id")):
            n["name"] = names[m.get("tool_call_id")]
        out.append(n)
    return out


@dataclass
class Piece:
    """What a sentinel becomes: ids recorded (or tokenized) for one assistant turn; `ended`: its last reply
    ended with the sampled EOS, which is the template's end of turn."""

    ids: list[int]
    ended: bool


class ChatRenderer:
    """The chat template of one tokenizer, rendering with recorded replies and parsing replies.
    `tags`: the model's tag protocol (tags.py): tool calls in tags instead of the template's format."""

    def __init__(self, tokenizer, tags: TagSettings | None = None, **template_kwargs):
        self.tokenizer, self.template_kwargs, self.tags = tokenizer, template_kwargs, tags
        self.eos_id = tokenizer.eos_token_id
        self.eot = tokenizer.convert_ids_to_tokens(self.eos_id)  # the text a template writes for EOS
        self.tools_in_template = tags is None and template_supports_tools(tokenizer, **template_kwargs)
        self.hermes = HermesFormat()

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def _render(self, messages: list[dict], tools: list[dict] | None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=False, **self.template_kwargs
        )

    def _tag_mode(self, messages: list[dict], tools: list[dict] | None) -> bool:
        return self.tags is not None and (bool(tools) or any(m.get("tool_calls") for m in messages))

    def call_stops(self, tools: list[dict] | None, parse_tools: bool) -> tuple[str, ...]:
        """Stop strings a request samples with besides its own: the closing tags of the tools it offers."""
        return tuple(self.tags.format_for(tools).stop_strings) if self.tags is not None and parse_tools else ()

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None, log: EpisodeLog) -> tuple[list[int], int]:
        """(the prompt's token ids, how many assistant messages were the episode's own replies)."""
        shown = normalize(messages)
        if self._tag_mode(shown, tools):
            return self._tag_prompt_ids(shown, tools, log)
        known = {i: c for i, m in enumerate(shown) if m.get("role") == "assistant" and (c := log.find_reply(m, i)) is not None}
        pieces = {i: self._piece(c) for i, c in known.items()}
        return self._with_pieces(shown, pieces, tools), len(known)

    def _piece(self, call: Call) -> Piece:
        return Piece(list(call.sampled_ids), bool(call.sampled_ids) and call.sampled_ids[-1] == self.eos_id)

    def _with_pieces(self, shown: list[dict], pieces: dict[int, Piece], tools: list[dict] | None, open_at: int | None = None) -> list[int]:
        """The rendered ids with message i's text replaced by pieces[i]'s ids. A template that drops or repeats
        an old turn gets that message as text instead."""
        pieces = dict(pieces)
        while True:
            text = self._render([{"role": "assistant", "content": sentinel(i)} if i in pieces else m for i, m in enumerate(shown)], tools)
            lost = [i for i in pieces if text.count(sentinel(i)) != 1]
            if not lost:
                return self._assemble(text, pieces, open_at)
            for i in lost:
                if shown[i].get("content", "").startswith("\ue000"):  # a collapsed tag turn: its text
                    shown[i] = {"role": "assistant", "content": self.tokenizer.decode(pieces[i].ids, skip_special_tokens=True)}
                del pieces[i]
                open_at = None if open_at == i else open_at

    def _assemble(self, text: str, pieces: dict[int, Piece], open_at: int | None = None) -> list[int]:
        ids: list[int] = []
        pos = 0
        for i in sorted(pieces, key=lambda i: text.index(sentinel(i))):
            at = text.index(sentinel(i))
            ids += self._ids(text[pos:at]) + pieces[i].ids
            if i == open_at:  # the turn the next reply continues: nothing after it
                return ids
            pos = at + len(sentinel(i))
            end = text.find(self.eot, pos) if pieces[i].ended else -1
            if end >= 0 and not text[pos:end].strip():  # the template's end of turn: the sampled EOS
                pos = end + len(self.eot)
        return ids + self._ids(text[pos:])

    # ---------------------------------------------------------------- the tag protocol

    def _tag_prompt_ids(self, shown: list[dict], tools: list[dict] | None, log: EpisodeLog) -> tuple[list[int], int]:
        """Each chain (a call, its results, ... the final reply) is one assistant message whose ids are the
        replies' sampled ids and the results' text; the tools' description goes in the system prompt."""
        assert self.tags is not None, "only with the tag protocol"
        fmt = self.tags.format_for(tools, shown)
        starts = {c.start: c for c in chains(shown)}
        out: list[dict] = []
        pieces: dict[int, Piece] = {}
        open_at, own, i = None, 0, 0
        while i < len(shown):
            c = starts.get(i)
            if c is None:
                call = log.find_reply(shown[i], i) if shown[i].get("role") == "assistant" else None
                if call is not None:
                    pieces[len(out)], own = self._piece(call), own + 1
                out.append(shown[i])
                i += 1
                continue
            piece, n = self._chain_piece(shown, c, fmt, tools, log)
            open_at = len(out) if c.open else open_at
            pieces[len(out)], own = piece, own + n
            out.append({"role": "assistant", "content": sentinel(len(out))})
            i = c.end
        described = fmt.describe(tools or []) if self.tags.describe else ""
        if described:
            out, shift = _with_system_text(out, described)
            pieces = {k + shift: v for k, v in pieces.items()}
            open_at = None if open_at is None else open_at + shift
        return self._with_pieces(out, pieces, None, open_at), own

    def _chain_piece(self, shown: list[dict], c: Chain, fmt: TagFormat, tools: list[dict] | None, log: EpisodeLog) -> tuple[Piece, int]:
        """(the chain's ids, how many of its replies the episode's own): recorded replies as their sampled ids,
        others as their text with their calls in tags; each call's results as the `tools:` path appends them."""
        parts: list[list[int] | str] = []
        own, ended, j = 0, False, c.start
        while j < c.end:
            m, call = shown[j], log.find_reply(shown[j], j)
            parts.append(list(call.sampled_ids) if call is not None else _text(m.get("content")) + "".join(
                tag_text(tc, fmt, tools) for tc in m.get("tool_calls") or []))  # fmt: skip
            own += call is not None
            j += 1
            results = []
            while j < c.end and shown[j].get("role") == "tool":
                results.append(shown[j])
                j += 1
            text = results_text(fmt, results) if results else ""
            after = self._after_stop(call, fmt) if call is not None else ""
            if after and text.startswith(after):  # the call's last token already holds the result tag's start
                text = text[len(after) :]
            parts.append(text)
            ended = call is not None and not results and self._piece(call).ended
        ids: list[int] = []
        text = ""
        for p in parts:  # adjacent texts are tokenized as one
            if isinstance(p, str):
                text += p
            else:
                ids, text = ids + self._ids(text) + p, ""
        ids += self._ids(text)
        return Piece(ids, ended), own

    def _after_stop(self, call: Call, fmt: TagFormat) -> str:
        """Text of the call's last token after its closing tag (SmolLM2 writes `</calc><` as `</`, `calc`, `><`)."""
        full = self.tokenizer.decode(call.sampled_ids, skip_special_tokens=True)
        return full[len(cut_after_stop(full, fmt.stop_strings)) :]

    def _tag_reply(self, sampled_ids: list[int], stops: Sequence[str], tools: list[dict] | None, call_id: str) -> tuple[dict, str]:
        assert self.tags is not None, "only with the tag protocol"
        fmt = self.tags.format_for(tools)
        full = self.tokenizer.decode(sampled_ids, skip_special_tokens=True)
        before_stop = cut_at_stop(full, stops)
        closes = [i for s in fmt.stop_strings if (i := full.find(s)) >= 0]
        # a call when a closing tag comes before any of the request's own stop strings
        calls = fmt.parse(through := cut_after_stop(full, fmt.stop_strings)) if closes and min(closes) < len(before_stop) else []
        if not calls:
            return {"role": "assistant", "content": before_stop}, before_stop
        call = calls[0]
        content = through.rstrip()[: -len(call.raw)] or None
        fn = {"name": call.name, "arguments": arguments(str(call.arguments), params_of(tools, call.name))}
        tool_calls = [{"id": f"{call_id}_0", "type": "function", "function": fn}]
        return {"role": "assistant", "content": content, "tool_calls": tool_calls}, through

    # ---------------------------------------------------------------- replies

    def reply(self, sampled_ids: list[int], stops: Sequence[str], parse_tools: bool, call_id: str,
              tools: list[dict] | None = None) -> tuple[dict, str]:  # fmt: skip
        """(the OpenAI assistant message, the text returned) for sampled ids. Tool calls are parsed when
        `parse_tools` (the request offered `tools`) and the template renders tools, or in the tag protocol;
        `call_id` prefixes their ids."""
        if self.tags is not None and parse_tools:
            return self._tag_reply(sampled_ids, stops, tools, call_id)
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


def _with_system_text(messages: list[dict], text: str) -> tuple[list[dict], int]:
    """(the messages with the tools' description after the system prompt's text, or as a new system message first
    (as the `tools:` path puts it), how many messages were added before the others)."""
    from rlvr.rollout.sources.multi_turn import _with_system_text as put

    out = put(messages, text)
    return out, len(out) - len(messages)
