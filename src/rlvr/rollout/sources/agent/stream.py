"""`stream: true`: a finished reply sent as OpenAI's server-sent events, for agents and frameworks that stream.

The reply is sampled whole first (its tokens are recorded exactly as without streaming), then sent as
the chunks OpenAI's API sends: per choice, the role, the content, the tool calls (each with its id,
name and arguments), the finish reason; then, when `stream_options.include_usage` is set, a last chunk
with the usage; then `data: [DONE]`. A client that joins the deltas gets the non-streamed message.
"""

from __future__ import annotations

import json
from typing import Any, Iterator


def _chunk(response: dict, obj: str, choices: list[dict], **extra: Any) -> dict:
    return {"id": response["id"], "object": obj, "created": response["created"], "model": response["model"], "choices": choices, **extra}


def chat_chunks(response: dict, include_usage: bool) -> Iterator[dict]:
    """The chat.completion.chunk objects of a chat.completion."""
    for choice in response["choices"]:
        i, msg = choice["index"], choice["message"]
        role = {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        yield _chunk(response, "chat.completion.chunk", [role])
        if msg.get("content"):
            delta = {"index": i, "delta": {"content": msg["content"]}, "logprobs": choice.get("logprobs"), "finish_reason": None}
            yield _chunk(response, "chat.completion.chunk", [delta])
        for j, tc in enumerate(msg.get("tool_calls") or []):
            call = {"index": j, "id": tc["id"], "type": "function", "function": dict(tc["function"])}
            yield _chunk(response, "chat.completion.chunk", [{"index": i, "delta": {"tool_calls": [call]}, "finish_reason": None}])
        yield _chunk(response, "chat.completion.chunk", [{"index": i, "delta": {}, "finish_reason": choice["finish_reason"]}])
    if include_usage:
        yield _chunk(response, "chat.completion.chunk", [], usage=response["usage"])


def text_chunks(response: dict, include_usage: bool) -> Iterator[dict]:
    """The chunks of a text_completion: each choice's text, then its finish reason."""
    for choice in response["choices"]:
        i = choice["index"]
        text = {"index": i, "text": choice["text"], "logprobs": choice.get("logprobs"), "finish_reason": None}
        yield _chunk(response, "text_completion", [text])
        yield _chunk(response, "text_completion", [{"index": i, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]}])
    if include_usage:
        yield _chunk(response, "text_completion", [], usage=response["usage"])


def sse(response: dict, include_usage: bool) -> bytes:
    """The whole event stream of a finished response (chat or text completion)."""
    chunks = chat_chunks if response.get("object") == "chat.completion" else text_chunks
    events = [f"data: {json.dumps(c)}\n\n" for c in chunks(response, include_usage)]
    return ("".join(events) + "data: [DONE]\n\n").encode()


def wants_stream(raw: bytes) -> tuple[bool, bool]:
    """(stream, include_usage) of a request body (False, False when it is not a JSON object)."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return False, False
    if not isinstance(body, dict) or not body.get("stream"):
        return False, False
    options = body.get("stream_options")
    return True, bool(isinstance(options, dict) and options.get("include_usage"))


def answer(handler, status: int, body: dict, raw: bytes = b"") -> None:
    """Write a response on a BaseHTTPRequestHandler: the event stream when the request `raw` asked for one and
    it succeeded, else the JSON body."""
    stream, usage = wants_stream(raw) if status == 200 else (False, False)
    data = sse(body, usage) if stream else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "text/event-stream" if stream else "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
