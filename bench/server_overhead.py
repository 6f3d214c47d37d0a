"""Where a generation server's time goes beyond the engine's: one batch of bench/engines.py's model B
(8 prompts x 8 completions, 64 new tokens, EOS ignored) generated in several ways, each timed over
--repeats calls after one warm-up: the hf engine called directly, rlvr's HFBackend (the server's
object) from the main thread, from a new thread per call (with and without binding it to the GPU
first) and from one long-lived thread, through rlvr's HTTP server in this process generating on its
handler threads (as before) and on the main thread (as `rlvr serve` does now), and through a
`rlvr serve` process. On a GPU, bench/gpu_servers.sh found the server 8x slower than in-process
generation; this says which layer adds it (bench/results/gpu_server_overhead.md).

    python bench/server_overhead.py --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from engines import build_model  # noqa: E402
from servers import stop_server, wait_health  # noqa: E402


def timed(fn, repeats: int, sync) -> list[float]:
    fn()
    out = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--port", type=int, default=8791)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rlvr_server_overhead"))
    a = ap.parse_args()
    from rlvr.models.loading import load_model, load_tokenizer
    from rlvr.rollout.engines.hf import HFEngine
    from rlvr.rollout.engines.protocols import SamplingParams
    from rlvr.rollout.engines.remote.client import RlvrServerClient
    from rlvr.rollout.engines.remote.protocol import GenerateRequest
    from rlvr.serve.hf_backend import HFBackend
    from rlvr.serve.http import make_server
    from rlvr.serve.main_thread import InlineWork, MainThreadWork

    path = build_model("B", a.work)
    dev = torch.device(a.device)
    tok, _ = load_tokenizer(str(path))
    model = load_model(str(path), a.dtype, dev).requires_grad_(False)
    prompts = [f"{i} + {i * 7} = " for i in range(8)]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    params = SamplingParams(8, 1.0, 1.0, 0, 64, True)
    req = GenerateRequest(ids, 8, list(range(8)), [64] * 8, 1.0, 1.0, 0, True, entropy=True)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    engine, backend = HFEngine(model, tok), HFBackend(model, tok, name=str(path))

    def in_thread(fn):
        def run():
            t = threading.Thread(target=fn)
            t.start()
            t.join()

        return run

    ways = {
        "engine, main thread (prompts as text)": lambda: engine.generate(prompts, params, list(range(8))),
        "HFBackend.generate, main thread": lambda: backend.generate(req),
        "HFBackend.generate, a new thread per call": in_thread(lambda: backend.generate(req)),
    }
    if dev.type == "cuda":  # does binding the thread to the device first (cudaSetDevice) make up the difference?
        ways["HFBackend.generate, a new thread per call, set_device first"] = in_thread(
            lambda: (torch.cuda.set_device(dev.index or 0), backend.generate(req))
        )
    pool = ThreadPoolExecutor(1)  # one thread for every call: a cost paid once per thread, or on every call?
    ways["HFBackend.generate, one long-lived thread"] = lambda: pool.submit(backend.generate, req).result()
    rows = {name: timed(fn, a.repeats, sync) for name, fn in ways.items()}
    pool.shutdown()

    def over_http(work) -> list[float]:
        """Timed through rlvr's HTTP server in this process, the backend doing its work on `work`'s thread."""
        server = make_server(HFBackend(model, tok, name=str(path), work=work), "127.0.0.1", a.port, None)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        client = RlvrServerClient(f"http://127.0.0.1:{a.port}")
        ask = lambda: timed(lambda: client.generate(req), a.repeats, sync)  # noqa: E731
        try:
            if not isinstance(work, MainThreadWork):
                return ask()
            stop, out = threading.Event(), {}  # this thread does the work while another one asks
            asker = threading.Thread(target=lambda: (out.setdefault("t", ask()), stop.set()))
            asker.start()
            work.run(stop, poll_s=0.01)
            asker.join()
            return out["t"]
        finally:
            server.shutdown()
            server.server_close()

    rows["HTTP server, generating on its handler threads (before)"] = over_http(InlineWork())
    rows["HTTP server, generating on the main thread (rlvr serve)"] = over_http(MainThreadWork())
    port = a.port + 1
    cmd = [
        sys.executable,
        "-m",
        "rlvr",
        "serve",
        str(path),
        "--engine",
        "hf",
        "--port",
        str(port),
        "--dtype",
        a.dtype,
        "--device",
        a.device,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        why = wait_health(f"http://127.0.0.1:{port}", proc, 120)
        other = RlvrServerClient(f"http://127.0.0.1:{port}")
        rows["`rlvr serve` process"] = [float("nan")] if why else timed(lambda: other.generate(req), a.repeats, sync)
    finally:
        stop_server(proc)
    print(f"model B, 8 x 8 rows, 64 new tokens, {a.device} {a.dtype}, torch {torch.__version__}; seconds per batch (median of {a.repeats})")
    print("| way | s (median) | min | max |\n|---|---|---|---|")
    for name, ts in rows.items():
        print(f"| {name} | {statistics.median(ts):.3f} | {min(ts):.3f} | {max(ts):.3f} |")


if __name__ == "__main__":
    main()
