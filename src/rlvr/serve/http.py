"""The generation server's HTTP side: JSON in and out, one thread per connection, a token check.

GET  /health                 {"engine", "model", "version", ...}; open to all (load balancers, waits)
POST /generate               GenerateRequest -> GenerateResult
POST /init_weight_transfer   {"host", "port", "backend", "lora"}: join the trainer's pair group
POST /update_weights         {"version", "metas": [[name, dtype, shape], ...]}: receive, then switch
POST /load_weights           {"version", "path"}: the filesystem sync
POST /v1/chat/completions, /v1/completions, GET /v1/models: OpenAI's API (rlvr.serve.openai_routes)

With a token, every request but GET /health needs `Authorization: Bearer TOKEN` (401 without it). A
request that fails answers 400 (bad input) or 500 with {"error": message}; the server goes on.
"""

from __future__ import annotations

import hmac
import json
import sys
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from rlvr.dist.transfer import TensorMeta
from rlvr.rollout.engines.remote.protocol import GenerateRequest


def routes(backend) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    def generate(body):
        return backend.generate(GenerateRequest.from_json(body)).as_json()

    def init(body):
        backend.init_weight_transfer(body["host"], int(body["port"]), body.get("backend", "gloo"), body.get("lora"))
        return {"ok": True}

    def update(body):
        backend.update_weights(int(body["version"]), [TensorMeta.from_json(m) for m in body["metas"]])
        return {"ok": True, "version": backend.version}

    def load(body):
        backend.load_weights(int(body["version"]), str(body["path"]))
        return {"ok": True, "version": backend.version}

    return {"/generate": generate, "/init_weight_transfer": init, "/update_weights": update, "/load_weights": load}


def make_server(backend, host: str, port: int, token: str | None, log: bool = False, tags=None) -> ThreadingHTTPServer:
    """`tags`: the /v1 routes speak the model's tag protocol (rlvr.rollout.sources.agent.tags.TagSettings)."""
    from rlvr.rollout.sources.agent.stream import answer
    from rlvr.serve.openai_routes import OpenAIRoutes

    posts, openai = routes(backend), OpenAIRoutes(backend, tags)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            if log:
                super().log_message(format, *args)

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            """True without a token or with the right one; else answers 401."""
            if token and not hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {token}"):
                self._answer(401, {"error": "this server needs `Authorization: Bearer TOKEN` (its --api-key)"})
                return False
            return True

        def do_GET(self):
            if self.path == "/health":
                self._answer(200, backend.health())
            elif self.path.rstrip("/") == "/v1/models":  # OpenAI's API: behind the token, as its other paths
                if self._authorized():
                    self._answer(200, openai.models())
            else:
                self._answer(404, {"error": f"no such endpoint: GET {self.path}"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self._authorized():
                return
            if self.path.startswith("/v1/"):
                answer(self, *openai.post(self.path, raw), raw)  # `stream: true`: as server-sent events
                return
            fn = posts.get(self.path)
            if fn is None:
                self._answer(404, {"error": f"no such endpoint: POST {self.path}"})
                return
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError as e:
                self._answer(400, {"error": f"the body is not JSON: {e}"})
                return
            try:
                self._answer(200, fn(body))
            except (ValueError, KeyError, TypeError) as e:
                self._answer(400, {"error": f"{type(e).__name__}: {e}"})
            except Exception as e:  # the request fails, the server stays up
                traceback.print_exc(file=sys.stderr)
                self._answer(500, {"error": f"{type(e).__name__}: {e}"})

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
