"""Chat-template helpers for tool calls through the template (the Hermes path).

An episode is built by appending: the model's sampled tokens are kept as sampled, and between
turns only new text is appended, never a re-rendering of what came before. That is sound only
when the template is prefix-preserving: rendering the conversation with the tool results
appended starts with the rendering without them, up to the end of the assistant turn. The
text to append after a turn (`glue_after_turn`) is computed from renderings:

    turn = render(messages)                                  # ...<assistant turn><eot>\\n
    full = render(messages + results, add_generation_prompt=True)
    glue = full[cut:], where cut is just after the turn's end-of-turn token in `turn`

The cut sits right after the end-of-turn token because that token is the last thing the model
sampled; what the template writes after it (Qwen's "\\n") belongs to the glue.
"""

from __future__ import annotations

import os

from rlvr.tools.registry import ToolError

_FIX = "use `tools.format=tags`, or a chat template that renders earlier turns the same way whatever follows them"
_PROBE = {
    "type": "function",
    "function": {
        "name": "probe_tool_7f3a",
        "description": "A probe.",
        "parameters": {"type": "object", "properties": {"arg_9c1e": {"type": "string", "description": "x"}}, "required": ["arg_9c1e"]},
    },
}


def _render(tokenizer, messages, tools, generation_prompt, kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=generation_prompt, tokenize=False, **kwargs)


def _probe_conversation(name: str) -> tuple[list[dict], list[dict]]:
    call = {"type": "function", "function": {"name": name, "arguments": {"arg_9c1e": "value_2b8d"}}}
    return (
        [{"role": "user", "content": "question_5e1c"}, {"role": "assistant", "content": "", "tool_calls": [call]}],
        [{"role": "tool", "name": name, "content": "result_4d2a"}],
    )


def tools_problem(tokenizer, **template_kwargs) -> str | None:
    """Why the chat template cannot carry tool calls (None when it can): it must show tool schemas
    given `tools=` (rendered with and without them, the prompts differ and name the tool) and
    render a whole tool exchange (the call's name and arguments, the tool message's content)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return "it has no chat template"
    messages, results = _probe_conversation("probe_tool_7f3a")
    try:
        plain = _render(tokenizer, messages[:1], None, True, template_kwargs)
        with_tools = _render(tokenizer, messages[:1], [_PROBE], True, template_kwargs)
        exchange = _render(tokenizer, messages + results, [_PROBE], True, template_kwargs)
    except Exception as e:  # templates reject tool roles in many ways (TemplateError, TypeError, ...)
        return f"it fails on a tool call and its result ({type(e).__name__}: {e})"
    if with_tools == plain:
        return "it ignores the tools argument: the prompt is the same with and without tools"
    if "probe_tool_7f3a" not in with_tools:
        return "it does not show the tools' names"
    lost = [
        what
        for what, s in (("the tool call's arguments", "value_2b8d"), ("the tool message's content", "result_4d2a"))
        if s not in exchange
    ]
    if lost:
        return f"it drops {' and '.join(lost)}"
    return None


def template_supports_tools(tokenizer, **template_kwargs) -> bool:
    """The template shows tool schemas when given `tools=` and renders a whole tool exchange (see tools_problem)."""
    return tools_problem(tokenizer, **template_kwargs) is None


def choose_format(kind: str, tokenizer, model: str) -> tuple[str, str | None]:
    """(`tags` or `chat_template`, a note saying why) for `tools.format=kind`; the note is None when
    the user chose. ToolError when `chat_template` is asked of a template that cannot render tools."""
    if kind == "tags":
        return kind, None
    problem = tools_problem(tokenizer)
    if kind == "chat_template":
        if problem:
            raise ToolError(
                f"`tools.format=chat_template`: the chat template of {model} cannot render tools= ({problem}), "
                "so the model would be offered no tools: set tools.format=tags (the tools are then described in the "
                "system prompt and called as <tag>input</tag>), or tools.format=auto, which chooses tags for this model"
            )
        return kind, None
    if problem:
        return "tags", (
            f"tools.format=auto -> tags: the chat template of {model} cannot render tools= ({problem}); "
            "the tools are described in the system prompt and called as <tag>input</tag>"
        )
    return "chat_template", (
        f"tools.format=auto -> chat_template: the chat template of {model} renders tools= and tool calls "
        "(its own call format, results as role: tool messages)"
    )


def glue_after_turn(
    tokenizer,
    messages: list[dict],
    tools_schemas: list[dict] | None,
    results_messages: list[dict],
    *,
    end_of_turn: str | None = None,
    **template_kwargs,
) -> str:
    """Text to append after the model's finished assistant turn (the last of `messages`, its
    sampled text ending with `end_of_turn`, default the tokenizer's EOS) so that the context
    equals the template's rendering of messages + results + the next assistant header.

    Raises ToolError when the template ends assistant turns otherwise, or is not prefix-preserving."""
    if not messages or messages[-1].get("role") != "assistant":
        raise ToolError("glue_after_turn: the last message must be the assistant turn that made the calls")
    eot = end_of_turn or getattr(tokenizer, "eos_token", None)
    before = _render(tokenizer, messages[:-1], tools_schemas, False, template_kwargs)
    turn = _render(tokenizer, messages, tools_schemas, False, template_kwargs)
    full = _render(tokenizer, messages + list(results_messages), tools_schemas, True, template_kwargs)
    start = len(os.path.commonprefix([before, turn]))  # where the assistant turn's text begins
    cut = turn.rfind(eot, start) if eot else -1
    if cut < 0:
        raise ToolError(
            f"the chat template does not end an assistant turn with {eot!r} (rendered turn: "
            f"{turn[start:][-80:]!r}); pass end_of_turn= the token that ends the model's turns"
        )
    assert eot is not None, "cut >= 0: eot was found in the turn"
    cut += len(eot)
    if not full.startswith(turn[:cut]):
        at = len(os.path.commonprefix([full, turn[:cut]]))
        raise ToolError(
            f"the chat template is not prefix-preserving: appending a tool result rewrites the text "
            f"before it (at character {at}: {turn[at : at + 40]!r} becomes {full[at : at + 40]!r}); {_FIX}"
        )
    return full[cut:]


def check_prefix_preserving(tokenizer, tools_schemas: list[dict] | None, *, end_of_turn: str | None = None, **template_kwargs) -> None:
    """Raise ToolError (naming the problem and the fix) unless appending a tool message after an
    assistant tool call leaves the text up to that turn's end unchanged. Run it once at start-up."""
    name = tools_schemas[0]["function"]["name"] if tools_schemas else "probe_tool_7f3a"
    messages, results = _probe_conversation(name)
    try:
        glue_after_turn(tokenizer, messages, tools_schemas, results, end_of_turn=end_of_turn, **template_kwargs)
    except ToolError:
        raise
    except Exception as e:
        raise ToolError(f"the chat template cannot render a tool call and its result ({type(e).__name__}: {e}); {_FIX}") from None
