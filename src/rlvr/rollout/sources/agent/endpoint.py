"""AgentEndpoint: an OpenAI-compatible server on 127.0.0.1 for agents run during collection.

Each episode gets its own base URL, `http://127.0.0.1:PORT/ep/<episode>/v1`, so its calls are
recorded in its own EpisodeLog whatever client the agent uses; every request needs the
endpoint's key (`Authorization: Bearer KEY`, what the openai client sends for `api_key`), else 401.

    POST /ep/<episode>/v1/chat/completions   messages (+ tools) -> rendered with the episode's own
                                             replies as their sampled tokens (render.py)
    POST /ep/<episode>/v1/completions        a prompt as text or token ids
    GET  /ep/<episode>/v1/models             the one model served (also GET /v1/models)

Requests are sampled through a Batcher (many episodes, one decode), or the hf engine's continuous
decoder (requests join and leave the decode token by token). The k-th request of an
episode seeded s samples with seed row_seed(s, 0, k) (a request's own `seed` is mixed in), so an
episode's randomness does not depend on the other episodes or on the batch it lands in.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlvr.rollout.engines.sampling import row_seed
from rlvr.rollout.sources.agent import api, stream
from rlvr.rollout.sources.agent.batcher import Batcher, Job, Sampler, Scheduler
from rlvr.rollout.sources.agent.calls import Call, EpisodeLog
from rlvr.rollout.sources.agent.render import ChatRenderer
from rlvr.rollout.sources.agent.tags import TagSettings

_ROUTE = re.compile(r"^/ep/([A-Za-z0-9_.-]+)/v1(/.*)$")


class NotFound(LookupError):
    pass


class _Server(ThreadingHTTPServer):
    request_queue_size = 512  # the default 5 resets connections when dozens of agents connect at once
    daemon_threads = True


def call_seed(episode_seed: int, k: int, asked: int | None = None) -> int:
    """The seed of an episode's k-th request (and of the request's own `seed`, when it sets one)."""
    s = row_seed(episode_seed, 0, k)
    return s if asked is None else row_seed(s, asked)


class AgentEndpoint:
    """`sample`: a Sampler (batcher.py), batched by a Batcher; or `scheduler`: what takes each request instead (the
    hf engine's continuous decoder), closed with the endpoint. `max_tokens`: the most tokens one reply may have (a
    request's max_tokens is capped there); `context_length`: prompt + reply must fit (None: unchecked); `tags`: the
    model calls tools in its tag protocol (tags.py) rather than its chat template's format; `driven`: the Batcher samples
    only inside `batcher.drive()`, on the caller's thread (the trainer's main thread), not on a thread of its own."""

    def __init__(
        self,
        sample: Sampler | None,
        tokenizer,
        *,
        scheduler: Scheduler | None = None,
        model_name: str = "policy",
        max_tokens: int = 256,
        context_length: int | None = None,
        batch_wait: float = 0.01,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        tags: TagSettings | None = None,
        driven: bool = False,
        **template_kwargs,
    ):
        self.tokenizer, self.model_name, self.max_tokens, self.context_length = tokenizer, model_name, max_tokens, context_length
        self.api_key = api_key or secrets.token_urlsafe(24)
        self.renderer = ChatRenderer(tokenizer, tags, **template_kwargs)
        self.episodes: dict[str, EpisodeLog] = {}
        self.lock = threading.Lock()
        if scheduler is None and sample is None:
            raise ValueError("AgentEndpoint needs a sampler or a scheduler")
        self.batcher: Scheduler = scheduler or Batcher(sample, self._open_count, batch_wait, own_thread=not driven)  # type: ignore[arg-type]
        self.server = _Server((host, port), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, name="rlvr-agent-endpoint", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def base_url(self, episode: str) -> str:
        """What the agent's client takes as base_url for this episode."""
        return f"{self.url}/ep/{episode}/v1"

    def open_episode(self, seed: int, name: str | None = None) -> EpisodeLog:
        name = name or secrets.token_hex(6)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"episode name {name!r}: use letters, digits, _ . -")
        with self.lock:
            if name in self.episodes:
                raise ValueError(f"episode {name!r} is already open")
            self.episodes[name] = log = EpisodeLog(name, seed)
        return log

    def close_episode(self, name: str) -> EpisodeLog:
        """Stop serving the episode (later requests get 404) and return its log."""
        with self.lock:
            return self.episodes.pop(name)

    def _open_count(self) -> int:
        with self.lock:
            return len(self.episodes)

    def episode(self, name: str) -> EpisodeLog:
        with self.lock:
            log = self.episodes.get(name)
        if log is None:
            raise NotFound(f"episode {name!r} is not open (it ended, or this is not the base_url it was given)")
        return log

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.batcher.close()

    def __enter__(self) -> "AgentEndpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- requests

    def _budget(self, prompt_ids: list[int], s: api.Sampling) -> int:
        if self.context_length is None:
            return s.max_tokens
        room = self.context_length - len(prompt_ids)
        if room < 1:
            raise api.BadRequest(
                f"the prompt is {len(prompt_ids)} tokens: the model's context ({self.context_length}) leaves no room for a reply"
            )
        return min(s.max_tokens, room)

    def _sample(self, log: EpisodeLog, prompt_ids: list[int], s: api.Sampling):
        k = log.next_request()
        seed = call_seed(log.seed, k, s.seed)
        job = Job(prompt_ids, self._budget(prompt_ids, s), seed, s.n, s.temperature, s.top_p, s.stops, log.episode)
        return k, self.batcher.submit(job)

    def chat(self, log: EpisodeLog, body: dict) -> dict:
        s = api.sampling_of(body, self.max_tokens)
        messages = api.messages_of(body)
        tools, parse_tools = api.tools_of(body)
        try:
            prompt, _ = self.renderer.prompt_ids(messages, tools, log)
        except Exception as e:  # the template rejected these messages
            raise api.BadRequest(f"the chat template cannot render these messages ({type(e).__name__}: {e})", "messages") from e
        k, samples = self._sample(log, prompt, replace(s, stops=s.stops + self.renderer.call_stops(tools, parse_tools)))
        choices = []
        for j, smp in enumerate(samples):
            msg, text = self.renderer.reply(smp.ids, s.stops, parse_tools, f"call_{log.episode}_{k}_{j}", tools)
            calls = len(msg.get("tool_calls") or [])
            full = self.renderer.full_text(smp.ids)
            log.record(Call(k, prompt, smp.ids, smp.logprobs, smp.finish, messages, msg, None, text, full, calls))
            finish = "tool_calls" if calls else smp.finish
            lps = {"content": api.token_logprobs(self.tokenizer, smp)} if s.logprobs else None
            choices.append({"index": j, "message": msg, "finish_reason": finish, "logprobs": lps})
        done = sum(len(x.ids) for x in samples)
        return api.chat_completion(f"chatcmpl-{log.episode}-{k}", self.model_name, choices, len(prompt), done)

    def completions(self, log: EpisodeLog, body: dict) -> dict:
        s = api.sampling_of(body, self.max_tokens)
        choices: list[dict] = []
        prompt_tokens, done = 0, 0
        for p in api.prompts_of(body):
            prompt, text = self.renderer.completion_prompt(p, log)
            k, samples = self._sample(log, prompt, s)
            prompt_tokens += len(prompt)
            for smp in samples:
                reply = self.renderer.text(smp.ids, s.stops)
                full = self.renderer.full_text(smp.ids)
                log.record(Call(k, prompt, smp.ids, smp.logprobs, smp.finish, None, None, text, reply, full))
                lps = api.completion_logprobs(self.tokenizer, smp) if s.logprobs else None
                choices.append({"index": len(choices), "text": reply, "finish_reason": smp.finish, "logprobs": lps})
                done += len(smp.ids)
        return api.text_completion(f"cmpl-{log.episode}-{k}", self.model_name, choices, prompt_tokens, done)


def _handler(endpoint: AgentEndpoint):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            pass  # the agents' requests are many; errors are answered, not logged

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if hmac.compare_digest(self.headers.get("Authorization", "").encode(), f"Bearer {endpoint.api_key}".encode()):
                return True
            why = "this endpoint needs `Authorization: Bearer KEY` with the api_key the agent was given"
            self._answer(401, api.error_body(why, code="invalid_api_key"))
            return False

        def do_GET(self):
            if not self._authorized():
                return
            m = _ROUTE.match(self.path)
            if self.path.rstrip("/") == "/v1/models" or (m and m.group(2).rstrip("/") == "/models"):
                self._answer(200, api.models_list(endpoint.model_name))
            else:
                self._answer(404, api.error_body(f"no such endpoint: GET {self.path}"))

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self._authorized():
                return
            status, body = _serve_post(endpoint, self.path, raw)
            stream.answer(self, status, body, raw)  # `stream: true`: as server-sent events

    return Handler


def _serve_post(endpoint: AgentEndpoint, path: str, raw: bytes) -> tuple[int, dict]:
    m = _ROUTE.match(path)
    route = {"/chat/completions": endpoint.chat, "/completions": endpoint.completions}.get(m.group(2).rstrip("/")) if m else None
    if m is None or route is None:
        where = "an episode's requests go to /ep/<episode>/v1/chat/completions or /completions"
        return 404, api.error_body(f"no such endpoint: POST {path} ({where})")
    try:
        body = json.loads(raw or b"{}")
        if not isinstance(body, dict):
            raise api.BadRequest("the request body must be a JSON object")
        return 200, route(endpoint.episode(m.group(1)), body)
    except NotFound as e:
        return 404, api.error_body(str(e), code="episode_not_found")
    except (api.BadRequest, json.JSONDecodeError) as e:
        return 400, api.error_body(str(e), param=getattr(e, "param", None))
    except Exception as e:  # the sampler failed: the agent sees a server error, the endpoint goes on
        return 500, api.error_body(f"{type(e).__name__}: {e}", kind="server_error")
