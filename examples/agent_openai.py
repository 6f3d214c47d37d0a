"""A calculator agent written only against the `openai` client: it runs unchanged against any
OpenAI-compatible server (rlvr's endpoint while training with `rollout.agent`, vLLM, a hosted API).

    rlvr train rollout.agent=examples/agent_openai.py:calculator_agent ...

rlvr calls calculator_agent(row, base_url, model, api_key) once per episode; the reward it returns
(1.0 when the final answer holds the row's answer) is the episode's reward. `row["prompt"]` is the
question as text, or chat messages (a conversational dataset: few-shot turns, a system prompt).

Models whose chat template calls tools (Qwen2.5, Qwen3, Hermes) answer with `tool_calls` as they are;
models that call tools in tags (the bundled tiny-tools, SmolLM2) need the endpoint told their tags:
`tools.format=tags tools.tags=[calculator=calc]` (training), `--tool-tags calculator=calc` (rlvr serve,
rlvr eval). See docs/agents.md.
"""

from __future__ import annotations

import json
import re

from openai import DefaultHttpxClient, OpenAI

# One HTTP client for every episode: building one loads the CA bundle (~40 ms of CPU), which at a
# client per episode and hundreds of episodes per step would cost more than the model's decode.
HTTP = DefaultHttpxClient()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
        },
    }
]


def calculate(expression: str) -> str:
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression):
        return "error: only numbers and + - * / ( ) are allowed"
    try:
        return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - checked to be arithmetic above
    except Exception as e:  # the model sees the error and may try again
        return f"error: {e}"


def calculator_agent(row: dict, base_url: str, model: str, api_key: str, max_turns: int = 4) -> float:
    client = OpenAI(base_url=base_url, api_key=api_key, http_client=HTTP)
    prompt = row["prompt"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    for _ in range(max_turns):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=64).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))  # sent back as it came: rlvr maps it to its exact tokens
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            args = json.loads(call.function.arguments or "{}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(str(args.get("expression", "")))})
    final = messages[-1].get("content") or ""
    return float(str(row.get("answer", "")).strip() in final)
