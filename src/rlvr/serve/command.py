"""`rlvr serve MODEL --engine hf|vllm`: a generation server for trainers' `rollout.servers`."""

from __future__ import annotations

import signal
import sys

import argparse
import os
import threading
import time

from rlvr.serve import check_bind, server_token

ENGINES = ("hf", "vllm")


def add_parser(sub) -> None:
    sv = sub.add_parser(
        "serve",
        help="start a generation server that trainers reach with rollout.servers=[http://HOST:PORT]",
        description="A generation server: rlvr's hf engine, or vLLM's own OpenAI-compatible server, with weight sync "
        "from the trainer (torch.distributed, or a shared folder) and a weight version on every answer. "
        "See docs/scale-out.md.",
    )
    sv.add_argument("model", help="model folder or hub id in the local cache (`tiny`: the bundled model)")
    sv.add_argument("--engine", choices=ENGINES, default="hf")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind; any but loopback needs --api-key")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--api-key", default=None, help="token every request but /health must carry (default: $RLVR_SERVER_TOKEN)")
    sv.add_argument("--device", default="auto", help="hf: cpu, cuda, cuda:N or auto")
    sv.add_argument("--dtype", default=None, help="the weights' dtype: float32, bfloat16, float16 (default: hf float32, vllm auto)")
    sv.add_argument("--autocast", choices=("none", "bf16"), default="none", help="hf: bf16 autocast, as the trainer's model.autocast")
    sv.add_argument("--threads", type=int, default=0, help="hf: torch CPU threads (0: torch's default, every core)")
    sv.add_argument("--timeout", type=float, default=600.0, help="seconds a weight sync may take before it is abandoned")
    sv.add_argument("--trust-remote-code", action="store_true")
    sv.add_argument(
        "--tool-tags",
        action="append",
        metavar="TOOL=TAG",
        help="hf: /v1/chat/completions speaks the model's tag protocol (as tools.format=tags): a reply ending in "
        "<TAG>text</TAG> is a tool call of TOOL, results go back as <result>text</result> in the same turn; "
        "e.g. calculator=calc (repeatable, comma-separated; a tool not named uses its own name as tag)",
    )
    sv.add_argument(
        "--tool-describe",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --tool-tags: describe the request's tools in the system prompt (tools.describe; "
        "--no-tool-describe for a model trained on the tags without it)",
    )
    sv.add_argument("--exit-with", type=int, metavar="PID", help=argparse.SUPPRESS)  # a trainer's local server ends with it
    sv.epilog = "With --engine vllm, arguments rlvr does not know go to vLLM's server as they are (e.g. --max-model-len 2048)."


def run(args) -> int:
    token = server_token(args.api_key)
    try:
        check_bind(args.host, token)
    except ValueError as e:
        print(f"rlvr serve: {e}", file=sys.stderr)
        return 2
    if args.engine == "vllm" and args.tool_tags:
        print("rlvr serve: --tool-tags is for --engine hf (vLLM parses tool calls with its own --tool-call-parser)", file=sys.stderr)
        return 2
    if args.engine == "vllm":
        from rlvr.serve.vllm_server import serve_vllm

        extra = [a for a in getattr(args, "extra", []) if a != "--"]
        return serve_vllm(args.model, host=args.host, port=args.port, api_key=token, dtype=args.dtype or "auto", extra_args=extra)
    if getattr(args, "extra", []):
        print(f"rlvr serve: unrecognized arguments: {' '.join(args.extra)}", file=sys.stderr)
        return 2
    try:
        tags = tag_settings(args.tool_tags, args.tool_describe)
    except ValueError as e:
        print(f"rlvr serve: {e}", file=sys.stderr)
        return 2
    return _serve_hf(args, token, tags)


def tag_settings(pairs: list[str] | None, describe: bool):
    """--tool-tags as the endpoint's TagSettings (None without the flag)."""
    if pairs is None:
        return None
    from rlvr.rollout.sources.agent.tags import TagSettings
    from rlvr.tools.formats import TagFormat

    items = [p.strip() for item in pairs for p in item.split(",") if p.strip()]
    bad = [p for p in items if p.count("=") != 1 or not all(x.strip() for x in p.split("="))]
    if bad or not items:
        raise ValueError(f"--tool-tags takes TOOL=TAG pairs (e.g. calculator=calc), got {', '.join(bad) or repr('')}")
    tags = {name.strip(): tag.strip() for name, tag in (p.split("=") for p in items)}
    TagFormat(tags)  # a tag that is not a plain name, two tools sharing one: refused now, not on the first request
    return TagSettings(tags, describe=describe)


def _serve_hf(args, token: str | None, tags=None) -> int:
    from rlvr.models.loading import load_model, load_tokenizer
    from rlvr.serve.hf_backend import HFBackend
    from rlvr.serve.http import make_server
    from rlvr.serve.main_thread import MainThreadWork
    import torch

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    tokenizer, _ = load_tokenizer(args.model, args.trust_remote_code)
    model = load_model(args.model, args.dtype or "float32", device, args.trust_remote_code)
    model.requires_grad_(False)
    work = MainThreadWork()  # the model runs on this thread, the HTTP server on its own (main_thread.py says why)
    backend = HFBackend(model, tokenizer, name=args.model, autocast=args.autocast, timeout=args.timeout, work=work)
    try:
        server = make_server(backend, args.host, args.port, token, tags=tags)
    except OSError as e:  # the port is taken, or the address is not this host's
        print(f"rlvr serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    if args.exit_with:
        threading.Thread(target=_exit_with, args=(args.exit_with,), daemon=True).start()
    signal.signal(signal.SIGTERM, _interrupt)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    how = f", tool calls in tags {', '.join(f'{n}={t}' for n, t in tags.tags.items())}" if tags else ""
    print(f"rlvr serve: engine hf, model {args.model} on {device}{how}, listening on http://{host}:{port}", flush=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="rlvr-http", daemon=True).start()
    try:
        work.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


def _exit_with(pid: int) -> None:
    """End this server when process `pid` is gone (a trainer killed with SIGKILL cannot stop its local server)."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:  # alive, someone else's
            pass


def _interrupt(*_) -> None:
    raise KeyboardInterrupt  # SIGTERM: leave serve_forever as Ctrl-C does
