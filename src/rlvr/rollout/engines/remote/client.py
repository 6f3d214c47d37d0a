"""The trainer's HTTP client of rlvr's own generation server (`rlvr serve --engine hf`, rlvr.serve.http)."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Sequence

from rlvr.dist.transfer import TensorMeta
from rlvr.rollout.engines.remote.protocol import GenerateRequest, GenerateResult, ServerError

HEALTH_TIMEOUT_S = 10.0


def call_json(url: str, path: str, body: dict | None, *, token: str | None, timeout: float) -> dict[str, Any]:
    """GET (body None) or POST JSON to url + path; the JSON answer, or ServerError saying what went wrong."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method="GET" if body is None else "POST")
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            why = json.loads(e.read()).get("error", "")
        except (ValueError, OSError):
            why = ""
        raise ServerError(url, f"{path} answered {e.code} {e.reason}" + (f": {why}" if why else ""), e.code) from e
    except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ServerError(url, f"{path} failed: {reason} (timeout {timeout:g}s)") from e
    except ValueError as e:
        raise ServerError(url, f"{path} answered something that is not JSON: {e}") from e


class RlvrServerClient:
    """ServerClient of an rlvr hf server. `timeout`: seconds a request may take before the server counts as gone."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 600.0):
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout

    def _post(self, path: str, body: dict) -> dict[str, Any]:
        return call_json(self.url, path, body, token=self.token, timeout=self.timeout)

    def health(self) -> dict[str, Any]:
        return call_json(self.url, "/health", None, token=self.token, timeout=min(HEALTH_TIMEOUT_S, self.timeout))

    def generate(self, request: GenerateRequest) -> GenerateResult:
        return GenerateResult.from_json(self._post("/generate", request.as_json()))

    def init_weight_transfer(self, host: str, port: int, backend: str, lora: dict[str, Any] | None) -> None:
        self._post("/init_weight_transfer", {"host": host, "port": port, "backend": backend, "lora": lora})

    def update_weights(self, version: int, metas: Sequence[TensorMeta]) -> None:
        self._post("/update_weights", {"version": version, "metas": [m.as_json() for m in metas]})

    def load_weights(self, version: int, path: str) -> None:
        self._post("/load_weights", {"version": version, "path": path})


def make_client(url: str, *, token: str | None, timeout: float, wait: float = 0.0):
    """The client for the server at `url`, which /health names (rlvr's hf server says so; anything else that answers
    is taken for vLLM's own server). Waits up to `wait` seconds for it to answer; ServerError if it never does."""
    deadline = time.monotonic() + wait
    while True:
        try:
            health = call_json(url, "/health", None, token=token, timeout=min(HEALTH_TIMEOUT_S, timeout))
            break
        except ServerError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
    if health.get("engine") == "hf":
        return RlvrServerClient(url, token=token, timeout=timeout)
    from rlvr.rollout.engines.remote.vllm_client import VLLMServerClient

    return VLLMServerClient(url, api_key=token, timeout=timeout)
