"""`rlvr serve --engine hf` as an OpenAI-compatible server: /v1/chat/completions, /v1/completions and
/v1/models, so an agent written against the `openai` client (the one `rollout.agent` trains) runs
against the served policy outside training, unchanged. The same code as the training endpoint
(rlvr.rollout.sources.agent): each request is its own episode, sampled by the server's hf engine
with the weights it holds (a trainer's syncs included)."""

from __future__ import annotations

import json
import secrets
import threading
from typing import Any

from rlvr.rollout.sources.agent import AgentEndpoint, api
from rlvr.rollout.sources.agent.endpoint import NotFound

MAX_TOKENS = 512  # a request's max_tokens is capped here (and by the model's context)


class OpenAIRoutes:
    """The /v1 routes over an HFBackend (rlvr.serve.hf_backend); the endpoint is made on the first request."""

    def __init__(self, backend, tags=None):
        self.backend, self.tags = backend, tags  # tags: the model calls tools in tags (`rlvr serve --tool-tags`)
        self._endpoint: AgentEndpoint | None = None
        self._lock = threading.Lock()

    def endpoint(self) -> AgentEndpoint:
        with self._lock:
            if self._endpoint is None:
                context = getattr(self.backend.model.config, "max_position_embeddings", None)
                sample = lambda request: self.backend.generate(request).samples  # noqa: E731
                self._endpoint = AgentEndpoint(
                    sample, self.backend.tokenizer, model_name=self.backend.name, max_tokens=MAX_TOKENS, context_length=context,
                    tags=self.tags,
                )  # fmt: skip
            return self._endpoint

    def models(self) -> dict[str, Any]:
        return api.models_list(self.backend.name)

    def post(self, path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        """(status, body) of POST /v1/chat/completions or /v1/completions."""
        ep = self.endpoint()
        route = {"/v1/chat/completions": ep.chat, "/v1/completions": ep.completions}.get(path.rstrip("/"))
        if route is None:
            return 404, api.error_body(f"no such endpoint: POST {path}")
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as e:
            return 400, api.error_body(str(e))
        if not isinstance(body, dict):
            return 400, api.error_body("the request body must be a JSON object")
        # one request, one episode: nothing is kept between requests; a request's own `seed` makes it reproducible
        log = ep.open_episode(0 if isinstance(body.get("seed"), int) else secrets.randbits(62))
        try:
            return 200, route(log, body)
        except (api.BadRequest, json.JSONDecodeError) as e:
            return 400, api.error_body(str(e), param=getattr(e, "param", None))
        except NotFound as e:
            return 404, api.error_body(str(e))
        except Exception as e:  # the sampler failed: the client sees a server error, the server goes on
            return 500, api.error_body(f"{type(e).__name__}: {e}", kind="server_error")
        finally:
            ep.close_episode(log.episode)
