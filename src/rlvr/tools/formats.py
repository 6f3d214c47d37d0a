"""How a model calls tools and sees results: the tag protocol and the Hermes/Qwen JSON format.

Both have `stop_strings` (where generation of a turn pauses for tool calls) and
`parse(turn_text) -> list[ToolCall]` ([] when the turn made no call: the episode's answer).

- `TagFormat` (models without a tool-calling chat template): `<calc>12*34</calc>`; generation
  pauses at a closing tag, the call runs, `<result>408</result>` is appended to the same text
  and generation resumes. Only a call whose closing tag ends the turn counts. `describe` gives
  the tools' text for the system prompt (their JSON schemas as chat templates render `tools=`).
- `HermesFormat` (chat templates with tools, e.g. Qwen2.5/Qwen3): the assistant turn holds one
  or more `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks and ends at
  the end-of-turn token; results go back as `role: tool` messages (see chat_template.py for
  the text appended between turns).
"""

from __future__ import annotations

import json
import re

from rlvr.tools.calling import ToolCall, ToolResult
from rlvr.tools.chat_template import check_prefix_preserving, glue_after_turn, template_supports_tools
from rlvr.tools.registry import ToolError

__all__ = ["TagFormat", "HermesFormat", "template_supports_tools", "check_prefix_preserving", "glue_after_turn"]

_TAG = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_NAME = re.compile(r'"name"\s*:\s*"([^"\\]*)"')


class TagFormat:
    """`tags`: tool name -> tag. A call is `<tag>arguments</tag>`; its result `<result>text</result>`."""

    def __init__(self, tags: dict[str, str], result_open: str = "<result>", result_close: str = "</result>", *, describe: bool = True):
        for name, tag in tags.items():
            if not isinstance(tag, str) or not _TAG.fullmatch(tag):
                raise ToolError(f"tool {name!r}: tag {tag!r} must be a plain name (letters, digits, _ . -)")
        by_tag: dict[str, str] = {}
        for name, tag in tags.items():
            if tag in by_tag:
                raise ToolError(f"tools {by_tag[tag]!r} and {name!r} share the tag {tag!r}; give each its own")
            by_tag[tag] = name
        self.tags = dict(tags)
        self._by_tag = by_tag
        self.result_open, self.result_close = result_open, result_close
        self.describe_tools = describe  # False for a model trained on the tags without a description

    @property
    def stop_strings(self) -> list[str]:
        """Closing tags: the engine ends a turn at the token that completes one of them."""
        return [f"</{tag}>" for tag in self.tags.values()]

    def parse(self, turn_text: str) -> list[ToolCall]:
        """The call closed at the end of `turn_text` (trailing whitespace allowed), else []."""
        text = turn_text.rstrip()
        for tag, name in self._by_tag.items():
            open_, close = f"<{tag}>", f"</{tag}>"
            if text.endswith(close):
                start = text.rfind(open_, 0, len(text) - len(close))
                if start < 0:
                    return []  # a closing tag without its opening tag is not a call
                return [ToolCall(name, text[start + len(open_) : len(text) - len(close)], text[start:])]
        return []

    def result_text(self, results: list[ToolResult]) -> str:
        """What is appended after the call (error messages appear the same way as results)."""
        return "".join(f"{self.result_open}{r.text}{self.result_close}" for r in results)

    def call_example(self, schema: dict) -> str:
        """How to call the tool of `schema` in this format: its single input as text, several as a JSON object."""
        fn = schema["function"]
        tag, params = self.tags[fn["name"]], list(fn.get("parameters", {}).get("properties", {}))
        if len(params) == 1:
            return f"<{tag}>{params[0]}</{tag}>"
        args = "{" + ", ".join(f'"{p}": ...' for p in params) + "}" if params else ""
        return f"<{tag}>{args}</{tag}>"

    def describe(self, schemas: list[dict]) -> str:
        """The tools for the system prompt, shaped as Qwen2.5-style chat templates render `tools=`
        (each JSON schema on a line inside <tools></tools>), then how this format calls each tool."""
        shown = [s for s in schemas if s["function"]["name"] in self.tags]
        if not shown:
            return ""
        lines = [
            "# Tools",
            "",
            "You may call one or more functions to assist with the user query.",
            "",
            "You are provided with function signatures within <tools></tools> XML tags:",
            "<tools>",
        ]
        lines += [json.dumps(s, ensure_ascii=False) for s in shown]  # what transformers' `tojson` writes
        lines += [
            "</tools>",
            "",
            f"To call a function, write its arguments between its tags; the result comes back within "
            f"{self.result_open}{self.result_close}:",
        ]
        lines += [f"{s['function']['name']}: {self.call_example(s)}" for s in shown]
        return "\n".join(lines)


class HermesFormat:
    """Hermes/Qwen tool calls: JSON inside `<tool_call>...</tool_call>`, results as tool messages.

    A malformed block still yields exactly one ToolCall (with `error` set, and the name when it
    can be read), so the model gets exactly one error result for it."""

    open_tag, close_tag = "<tool_call>", "</tool_call>"
    stop_strings: list[str] = []  # the turn ends at the template's end-of-turn token

    def parse(self, turn_text: str) -> list[ToolCall]:
        calls, pos = [], 0
        while (start := turn_text.find(self.open_tag, pos)) >= 0:
            body_start = start + len(self.open_tag)
            end = turn_text.find(self.close_tag, body_start)
            if end < 0:
                body = turn_text[body_start:]
                calls.append(self._call(body, turn_text[start:], f"the tool call is missing {self.close_tag}"))
                break
            calls.append(self._call(turn_text[body_start:end], turn_text[start : end + len(self.close_tag)]))
            pos = end + len(self.close_tag)
        return calls

    @staticmethod
    def _call(body: str, raw: str, error: str | None = None) -> ToolCall:
        try:
            obj = json.loads(body)
        except ValueError as e:
            found = _NAME.search(body)
            msg = getattr(e, "msg", str(e))
            return ToolCall(found.group(1) if found else "", {}, raw, error or f"the tool call is not valid JSON ({msg})")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return ToolCall("", {}, raw, error or 'expected {"name": "...", "arguments": {...}}')
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                parsed = json.loads(args)
                args = parsed if isinstance(parsed, dict) else args
            except ValueError:
                pass
        if args is None:
            args = {}
        if not isinstance(args, (dict, str)):
            return ToolCall(obj["name"], {}, raw, error or "arguments must be a JSON object")
        return ToolCall(obj["name"], args, raw, error)

    @staticmethod
    def result_messages(results: list[ToolResult]) -> list[dict]:
        return [{"role": "tool", "name": r.name, "content": r.text} for r in results]

    def assistant_message(self, turn_text: str, calls: list[ToolCall]) -> dict:
        """The assistant turn as a chat message (for rendering the conversation again)."""
        content = turn_text.split(self.open_tag, 1)[0].strip()
        tool_calls = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments if isinstance(c.arguments, dict) else {}}}
            for c in calls
        ]
        return {"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})}
