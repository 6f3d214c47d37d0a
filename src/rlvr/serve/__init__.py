"""Generation servers: `rlvr serve MODEL --engine hf|vllm`, what the trainer's `rollout.servers` reach.

http.py         the HTTP server: routes, JSON, the token that guards every endpoint but /health
openai_routes.py  OpenAI's API (/v1/chat/completions, /v1/completions, /v1/models) on the hf server
hf_backend.py   rlvr's hf engine behind the server: token-id requests, weight versions, staged swaps
vllm_server.py  vLLM's own OpenAI-compatible server with rlvr's gloo weight transfer registered
command.py      serve: the `rlvr serve` command
__init__.py     the token and bind rules both servers keep

The protocol both sides speak is rlvr.rollout.engines.remote.protocol; docs/scale-out.md shows a run.
"""

from __future__ import annotations

import os

TOKEN_ENV = "RLVR_SERVER_TOKEN"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def server_token(api_key: str | None) -> str | None:
    """--api-key, else $RLVR_SERVER_TOKEN, else None."""
    return api_key or os.environ.get(TOKEN_ENV) or None


def check_bind(host: str, token: str | None) -> None:
    """Any address but loopback needs a token: weights and state could otherwise be changed by anyone who reaches it."""
    if host not in LOOPBACK and not token:
        raise ValueError(
            f"--host {host}: binding an address other than 127.0.0.1 needs a token (--api-key TOKEN or ${TOKEN_ENV}); "
            "every request then needs `Authorization: Bearer TOKEN`"
        )
