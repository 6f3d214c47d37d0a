"""`rlvr serve MODEL --engine vllm`: vLLM's own OpenAI-compatible server, run in this process, set up for a trainer.

What rlvr adds to `vllm serve`, all through vLLM's own switches and registries:
- weight sync: the `rlvr_gloo` weight transfer backend (rlvr.serve.vllm_transfer) behind vLLM's RL
  endpoints (/init_weight_transfer_engine, /start_weight_update, /update_weights, /finish_weight_update,
  /pause, /resume, /weight_info; VLLM_SERVER_DEV_MODE turns them on), so the trainer's
  rlvr.dist.transfer.WeightSender sends to it unchanged;
- generation by token ids: vLLM's /inference/v1/generate (`--enable-scale-out`), whose answers name the
  weight version each token was sampled under; log-probs after temperature/top-k/top-p
  (`--logprobs-mode processed_logprobs`), as the colocated engine reports them;
- LoRA adapters synced as files: a resolver maps the adapter name of version N to the folder the
  transfer engine wrote (VLLM_ALLOW_RUNTIME_LORA_UPDATING lets requests name adapters loaded at run time);
- the token: vLLM's --api-key guards only its /v1, /inference... paths, while the RL and dev endpoints
  change weights and state too, so TokenGuard (`--middleware`) guards every path but /health.
The client is rlvr.rollout.engines.remote.vllm_client.VLLMServerClient.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from rlvr.serve import TOKEN_ENV, check_bind

OPEN_PATHS = ("/health",)  # what a load balancer or the trainer's liveness probe may ask without the token


def vllm_argv(model_path: str, *, name: str, host: str, port: int, api_key: str | None, dtype: str, extra_args: Sequence[str]) -> list[str]:
    """`vllm serve`'s arguments; the user's extra ones come last, so they win where they repeat one of ours."""
    from rlvr.serve.vllm_transfer import ENGINE_NAME

    argv = [
        "--model", model_path,
        "--served-model-name", name,
        "--host", host,
        "--port", str(port),
        "--dtype", dtype,
        "--weight-transfer-config", json.dumps({"backend": ENGINE_NAME}),
        "--worker-extension-cls", "rlvr.serve.vllm_transfer.RegisterRlvrTransfer",
        "--enable-scale-out",
        "--logprobs-mode", "processed_logprobs",
        "--middleware", f"{__name__}.ServerGuard",
    ]  # fmt: skip
    if api_key:
        argv += ["--api-key", api_key]
    return argv + list(extra_args)


def serve_vllm(model: str, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None, dtype: str = "auto",
               extra_args: Sequence[str] = ()) -> int:  # fmt: skip
    """Run vLLM's server for `model` (a folder, a cached hub id, or `tiny`) until it is stopped; -> exit code.
    Raises ValueError for a non-loopback host without a token (--api-key or $RLVR_SERVER_TOKEN)."""
    from rlvr.models.loading import resolve_existing

    token = api_key or os.environ.get(TOKEN_ENV) or None
    check_bind(host, token)
    path = resolve_existing(model)
    lora_root = tempfile.mkdtemp(prefix="rlvr-vllm-lora-")
    _set_env(token, lora_root)
    argv = vllm_argv(path, name=model, host=host, port=port, api_key=token, dtype=dtype, extra_args=extra_args)
    try:
        return _run(argv, lora_root)
    finally:
        shutil.rmtree(lora_root, ignore_errors=True)  # the synced adapters live only as long as the server


def _set_env(token: str | None, lora_root: str) -> None:
    """Before vLLM is imported: its envs module reads these once."""
    from rlvr.serve.vllm_transfer import LORA_DIR_ENV

    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # mounts vLLM's RL (weight sync, pause/resume) endpoints
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # requests may name an adapter the resolver finds
    os.environ[LORA_DIR_ENV] = lora_root  # workers write adapters there (inherited when they start)
    if token:
        os.environ[TOKEN_ENV] = token  # TokenGuard's, in every API process
    else:
        os.environ.pop(TOKEN_ENV, None)


def _run(argv: list[str], lora_root: str) -> int:
    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from rlvr.serve.vllm_transfer import register

    cli_env_setup()  # as `vllm serve` does (workers spawned, not forked)
    register()
    _register_adapter_resolver(lora_root)
    args = make_arg_parser(FlexibleArgumentParser(prog="rlvr serve --engine vllm")).parse_args(argv)
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    print(f"rlvr serve: engine vllm, model {args.model}, listening on http://{args.host}:{args.port}", flush=True)
    try:
        uvloop.run(run_server(args))
    except KeyboardInterrupt:
        pass
    return 0


def _register_adapter_resolver(root: str) -> None:
    """vLLM asks its LoRA resolvers for a model name it does not know: ours answers the adapter of version N
    (rlvr-lora-vN) with the folder the transfer engine wrote, once it is complete."""
    from vllm.lora.request import LoRARequest
    from vllm.lora.resolver import LoRAResolver, LoRAResolverRegistry

    from rlvr.serve.vllm_transfer import LORA_PREFIX

    class AdapterResolver(LoRAResolver):
        async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
            folder = Path(root) / lora_name
            if not lora_name.startswith(LORA_PREFIX) or not (folder / "adapter_config.json").exists():
                return None
            return LoRARequest(lora_name=lora_name, lora_int_id=1, lora_path=str(folder))  # vLLM assigns the id

    if "rlvr adapters" not in LoRAResolverRegistry.get_supported_resolvers():
        LoRAResolverRegistry.register_resolver("rlvr adapters", AdapterResolver())


class ServerGuard:
    """ASGI middleware. With $RLVR_SERVER_TOKEN set, every request but OPEN_PATHS needs `Authorization: Bearer TOKEN`
    (401 otherwise): vLLM's own --api-key check leaves its RL and dev endpoints open, this one does not. And an
    endpoint's exception comes back as a JSON 500 naming it (vLLM's RL endpoints would answer a bare 500), so the
    trainer's error says why a sync was refused."""

    def __init__(self, app) -> None:
        import hashlib

        self.app = app
        token = os.environ.get(TOKEN_ENV)
        self.digest = hashlib.sha256(token.encode()).digest() if token else None

    def _allowed(self, scope) -> bool:
        import hashlib
        import secrets

        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if self.digest is None or path in OPEN_PATHS or scope.get("method") == "OPTIONS":
            return True
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        scheme, _, given = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(hashlib.sha256(given.encode()).digest(), self.digest)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket" and not self._allowed(scope):
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        if self._allowed(scope):
            await self._guarded(scope, receive, send)
            return
        await _send_json(send, 401, f"unauthorized: this server needs `Authorization: Bearer TOKEN` (rlvr serve --api-key, ${TOKEN_ENV})")

    async def _guarded(self, scope, receive, send) -> None:
        started = False

        async def tracking_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as e:
            if started:
                raise
            await _send_json(send, 500, f"{type(e).__name__}: {e}"[:2000])


async def _send_json(send, status: int, error: str) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps({"error": error}).encode()})
