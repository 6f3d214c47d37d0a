"""OpenAI's request fields and response shapes, as the endpoint reads and writes them.

Read: model (any name is accepted: the endpoint serves one policy), temperature, top_p, n,
max_tokens / max_completion_tokens (capped at the endpoint's budget), stop, seed, logprobs;
tools and tool_choice for chat; stream (the finished reply as server-sent events, stream.py).
top_logprobs is refused with a clear 400. Fields OpenAI defines that change nothing here (user, metadata,
presence_penalty at 0, ...) are ignored.
Written: chat.completion / text_completion objects with id, choices, finish_reason
("stop", "length", "tool_calls"), usage, and log-probs of the sampled tokens.
"""

from __future__ import annotations

import time
from itertools import accumulate
from dataclasses import dataclass
from typing import Any

from rlvr.rollout.engines.remote.protocol import Sample


class BadRequest(ValueError):
    """A request the endpoint cannot serve (answered 400 with OpenAI's error shape)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Sampling:
    n: int
    temperature: float
    top_p: float
    max_tokens: int
    stops: tuple[str, ...]
    seed: int | None
    logprobs: bool


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise BadRequest(f"`{key}` must be a number in [{lo}, {hi}], got {v!r}", key)
    return float(v)


def _int(body: dict, key: str, lo: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise BadRequest(f"`{key}` must be an integer >= {lo}, got {v!r}", key)
    return v


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest(f"`stop` must be a string or a list of non-empty strings, got {stop!r}", "stop")
    return tuple(stops)


def sampling_of(body: dict, budget: int) -> Sampling:
    """The sampling settings of a request; `budget` caps max_tokens (the rollout's completion length)."""
    if body.get("top_logprobs"):
        raise BadRequest("`top_logprobs` is not supported: only the sampled tokens' log-probs are returned", "top_logprobs")
    asked = _int(body, "max_completion_tokens", 1) or _int(body, "max_tokens", 1)
    logprobs = body.get("logprobs")
    return Sampling(
        n=_int(body, "n", 1) or 1,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
        max_tokens=min(asked or budget, budget),
        stops=_stops(body),
        seed=_int(body, "seed", -(2**63)),
        logprobs=logprobs is not None and logprobs is not False,  # completions: an int, 0 included
    )


def messages_of(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("`messages` must be a non-empty list of {role, content} objects", "messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string `role`, got {m!r}", f"messages[{i}]")
    return msgs


def tools_of(body: dict) -> tuple[list[dict] | None, bool]:
    """(the tools for the template, whether replies are parsed for tool calls: tools given and tool_choice not "none")."""
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise BadRequest("`tools` must be a list of {type: function, function: {...}} objects", "tools")
    return tools or None, bool(tools) and body.get("tool_choice") != "none"


def prompts_of(body: dict) -> list[str | list[int]]:
    """/v1/completions prompts: a string, token ids, or a list of either."""
    p = body.get("prompt")
    ids = lambda x: isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x)  # noqa: E731
    if isinstance(p, str) or ids(p):
        return [p]  # type: ignore[list-item]
    if isinstance(p, list) and p and all(isinstance(x, str) or ids(x) for x in p):
        return list(p)
    raise BadRequest("`prompt` must be a string, a list of token ids, or a list of either", "prompt")


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def token_logprobs(tokenizer, sample: Sample) -> list[dict[str, Any]]:
    """Chat's logprobs.content: one entry per sampled token."""
    out = []
    for t, lp in zip(sample.ids, sample.logprobs):
        text = tokenizer.decode([t])
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def chat_completion(rid: str, model: str, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }


def text_completion(rid: str, model: str, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
    return {**chat_completion(rid, model, choices, prompt_tokens, completion_tokens), "object": "text_completion"}


def completion_logprobs(tokenizer, sample: Sample) -> dict[str, Any]:
    tokens = [tokenizer.decode([t]) for t in sample.ids]
    offsets = [0, *accumulate(len(x) for x in tokens)][: len(tokens)]
    return {"tokens": tokens, "token_logprobs": list(sample.logprobs), "top_logprobs": None, "text_offset": offsets}


def models_list(model: str) -> dict:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "rlvr"}]}
