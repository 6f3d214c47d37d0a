"""The tag protocol behind the OpenAI API, for models whose chat template has no place for tools
(e.g. the bundled tiny-tools, SmolLM2-135M-Instruct): the endpoint speaks the format rlvr's own
`tools:` path drives them with (rlvr.tools.formats.TagFormat), and the agent sees OpenAI tool calls.

    reply   `... <calc>12*34</calc>`  ->  {content: "... ", tool_calls: [{function: {name: calculator,
            arguments: '{"expression": "12*34"}'}}]}, finish_reason "tool_calls"
    render  assistant(tool_calls) + tool("408") + ...  ->  ONE assistant turn: the reply's sampled ids,
            `<result>408</result>`, the next reply's sampled ids, ...; while the last message is a tool
            result the turn stays open and the next reply continues it (no end of turn, no new header)

so an unchanged conversation is token for token the episode the `tools:` path builds: prompt, sampled
ids, the result text (context), sampled ids. A tag's text is the tool's single parameter (the one
its schema in the request names), or a JSON object when the schema has several.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rlvr.rollout.sources.agent.api import BadRequest
from rlvr.tools.calling import ToolResult
from rlvr.tools.formats import TagFormat
from rlvr.tools.registry import ToolError


@dataclass(frozen=True)
class TagSettings:
    """`tools.tags` ({tool: tag}), `tools.result_tags` and `tools.describe` for an agent's endpoint."""

    tags: dict[str, str]
    result_tags: tuple[str, str] = ("<result>", "</result>")
    describe: bool = True

    def format_for(self, tools: list[dict] | None, messages: list[dict] = ()) -> TagFormat:  # type: ignore[assignment]
        """The TagFormat of one request: every tool it offers or its messages call (a tool without a tag in
        `tools.tags` is called by its own name, as in the `tools:` path)."""
        names = [n for t in tools or [] if (n := _name(t))]
        names += [(tc.get("function") or {}).get("name") or "" for m in messages for tc in m.get("tool_calls") or []]
        try:
            tags = {n: self.tags.get(n, n) for n in dict.fromkeys(n for n in names if n)}
            return TagFormat(tags, *self.result_tags, describe=self.describe)
        except ToolError as e:
            raise BadRequest(f"{e} (set its tag with tools.tags / --tool-tags)", "tools") from None


def _name(tool: dict) -> str:
    return str((tool.get("function") or {}).get("name") or "")


def params_of(tools: list[dict] | None, name: str) -> list[str]:
    for t in tools or []:
        if _name(t) == name:
            return list(((t.get("function") or {}).get("parameters") or {}).get("properties") or {})
    return []


def arguments(text: str, params: list[str]) -> str:
    """OpenAI's `arguments` (a JSON string) for a tag's text: the single parameter's value, else the text as a
    JSON object (left as it is when it is not one: the agent sees what the model wrote, as with any model)."""
    if len(params) == 1:
        return json.dumps({params[0]: text})
    try:
        obj = json.loads(text) if text.strip() else {}
    except ValueError:
        return text
    return json.dumps(obj) if isinstance(obj, dict) else text


def tag_text(call: dict, fmt: TagFormat, tools: list[dict] | None) -> str:
    """`<tag>text</tag>` for an OpenAI tool call (the inverse of `arguments`)."""
    fn = call.get("function") or {}
    name, args = fn.get("name") or "", fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    params = params_of(tools, name)
    if isinstance(args, dict) and len(params) == 1 and params[0] in args and len(args) == 1:
        body = str(args[params[0]])
    else:
        body = args if isinstance(args, str) else json.dumps(args or {})
    tag = fmt.tags.get(name, name)
    return f"<{tag}>{body}</{tag}>"


def results_text(fmt: TagFormat, tool_messages: list[dict]) -> str:
    """`<result>...</result>` for each tool message, as the `tools:` path appends a call's results."""
    return fmt.result_text([ToolResult(str(m.get("name") or ""), str(m.get("content") or ""), True) for m in tool_messages])


@dataclass
class Chain:
    """Messages [start, end) that are one assistant turn in the tag protocol: assistant messages with tool
    calls, each followed by its tool results, and perhaps the final assistant message. `open`: it ends with
    tool results and nothing after them, so the next reply continues the turn."""

    start: int
    end: int
    open: bool
    parts: list[tuple[str, Any]] = field(default_factory=list)  # ("ids", [ids]) or ("text", str), in order
    ended: bool = False  # its last part is a reply that ended with the sampled EOS


def chains(messages: list[dict]) -> list[Chain]:
    """The chains of a conversation: each starts at an assistant message with tool calls."""
    out, i = [], 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            i += 1
            continue
        start = i
        while i < len(messages) and messages[i].get("role") == "assistant":
            has_calls = bool(messages[i].get("tool_calls"))
            i += 1
            if not has_calls:
                break  # the final reply closes the turn
            while i < len(messages) and messages[i].get("role") == "tool":
                i += 1
            if i < len(messages) and messages[i - 1].get("role") != "tool":
                break  # calls without results: the turn ends there
        out.append(Chain(start, i, i == len(messages) and messages[i - 1].get("role") == "tool"))
    return out
