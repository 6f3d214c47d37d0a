"""Whole GRPO steps with generation apart from training: in-process generation against `rlvr serve`
(engine hf, then vllm) on 127.0.0.1, synchronous (rollout.max_staleness=0) and one step off-policy
(max_staleness=1), and k = 1 with no server named (rlvr starts its own local hf server). Run by
bench/gpu_servers.sh on a GPU (also from bench/gpu.sh and bench/gpu_scale.sh):

    python bench/servers.py --device cuda --out bench/results/gpu_servers.md
    python bench/servers.py --device cpu --engines hf --steps 3 --warmup 1 --out /tmp/servers_cpu.md   # a CPU check

With two GPUs or more the server runs on the second (CUDA_VISIBLE_DEVICES=1: NCCL between two GPUs),
with one both share it. The model is bench/engines.py's B (25M Llama, random weights, 64 new tokens,
EOS ignored), 8 prompts x 8 completions per step. Runs go one after another, most important first,
and stop when --budget-s is spent (the rest are listed as not run). Each run's step time is split
into every `time/*` metric the trainer logs (generate, train, waiting for rollouts, weight sync, ...),
so the table needs no change when the trainer's names do.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from engines import build_model  # noqa: E402

NEW_TOKENS = 64
# (label, server engine or "" for in-process, max_staleness, extra overrides); most important first
RUNS = [
    ("in-process hf", "", 0, []),
    ("server hf", "hf", 0, []),
    ("server hf", "hf", 1, []),
    ("server vllm", "vllm", 0, []),
    ("server vllm", "vllm", 1, []),
    ("local server (none named)", "", 1, []),
    ("server hf, filesystem sync", "hf", 0, ["rollout.weight_sync=filesystem"]),
]


def wait_health(url: str, proc: subprocess.Popen, limit: float) -> str | None:
    """None once GET url/health answers 200; else why not."""
    end = time.time() + limit
    while time.time() < end:
        if proc.poll() is not None:
            return f"server exited with {proc.returncode} before answering /health"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return None
        except OSError:
            pass
        time.sleep(1)
    return f"no answer from {url}/health in {limit:.0f}s"


def start_server(engine: str, model: Path, a, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rlvr", "serve", str(model), "--engine", engine, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--dtype", a.dtype]
    cmd += shlex.split(a.vllm_serve_args) if engine == "vllm" else ["--device", a.device]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2")
    if a.device == "cuda" and a.ngpu >= 2:
        env["CUDA_VISIBLE_DEVICES"] = "1"  # the trainer has GPU 0
    # its own session, so stopping it stops the processes it started too (vLLM's engine core)
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def train_cmd(model: Path, a, out: Path, k: int, servers: list[str], extra: list[str]) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "rlvr",
        "train",
        f"model.path={model}",
        f"model.dtype={a.dtype}",
        f"device={a.device}",
        "rollout.prompts_per_step=8",
        "rollout.group_size=8",
        f"rollout.max_new_tokens={NEW_TOKENS}",
        "rollout.ignore_eos=true",
        f"rewards.0.fn={ROOT / 'bench' / 'bench_rewards.py'}:digit_share",
        f"steps={a.steps}",
        "eval_before_after=false",
        "report_to=[]",
        "doctor_every=0",
        "log_completions_every=0",
        f"output_dir={out}",
        f"rollout.max_staleness={k}",
    ]
    if servers:
        cmd.append(f"rollout.servers=[{','.join(servers)}]")
    if "rollout.weight_sync=filesystem" in extra:
        cmd.append(f"rollout.weight_dir={out}-weights")
    if a.device == "cpu":
        cmd.append(f"threads={a.threads}")
    return cmd + extra + ["--force"]


def summarize(rows: list[dict]) -> dict:
    """Medians of every time/* metric, the largest staleness, and any count of rows dropped as too stale."""
    num = lambda r, k: isinstance(r.get(k), (int, float))  # noqa: E731
    keys = sorted({k for r in rows for k in r if num(r, k) and (k.startswith("time/") or "sync" in k or "wait" in k)})
    out = {k: statistics.median(r[k] for r in rows if num(r, k)) for k in keys}
    for k in sorted({k for r in rows for k in r if k.startswith("staleness/") and num(r, k)}):
        out[k] = max(r[k] for r in rows if num(r, k)) if k.endswith("max") or "drop" in k else statistics.median(r[k] for r in rows)
    return out


def one_run(i: int, label: str, engine: str, k: int, extra: list[str], model: Path, a, limit: float) -> dict:
    out, port = a.work / f"run-{i}", a.port + i  # a fresh port: the last server's may linger in TIME_WAIT
    res = {"label": label, "engine": engine or "hf", "k": k, "extra": " ".join(extra)}
    server, servers, t0 = None, [], time.time()
    try:
        if engine:
            server = start_server(engine, model, a, port, Path(f"{out}-serve.log"))
            url = f"http://127.0.0.1:{port}"
            why = wait_health(url, server, min(a.serve_wait_s, limit))
            if why:
                return {**res, "error": why + ": " + Path(f"{out}-serve.log").read_text()[-600:]}
            res["serve_start_s"], servers = time.time() - t0, [url]
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2")
        if a.device == "cuda" and a.ngpu >= 2:
            env["CUDA_VISIBLE_DEVICES"] = "0"
        left = max(10.0, limit - (time.time() - t0))
        try:
            p = subprocess.run(train_cmd(model, a, out, k, servers, extra), capture_output=True, text=True, env=env, timeout=left)
        except subprocess.TimeoutExpired:
            return {**res, "error": f"rlvr train did not finish in {left:.0f}s"}
        if p.returncode != 0:
            return {**res, "error": f"rlvr train exited {p.returncode}: " + (p.stdout + p.stderr)[-800:]}
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][a.warmup :]
        if not rows:
            return {**res, "error": f"no steps after the first {a.warmup} in {out / 'metrics.jsonl'}"}
        return {**res, "steps": len(rows), **summarize(rows)}
    finally:
        if server is not None:
            stop_server(server)


def table(results: list[dict]) -> list[str]:
    lines = [
        "| run | engine | k | s/step | completion tok/s | time split (medians, s) | staleness | server start s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        head = f"| {r['label']} | {r['engine']} | {r['k']} |"
        if "error" in r or "skipped" in r:
            why = "NOT RUN: " + r["skipped"] if "skipped" in r else "FAILED: " + repr(r["error"][-300:]).replace("|", "/")
            lines.append(f"{head} {why} | | | | |")
            continue
        split = ", ".join(
            f"{k.removeprefix('time/')} {v / 1e6:.1f} MB" if "bytes" in k else f"{k.removeprefix('time/')} {v:.3f}"
            for k, v in r.items()
            if k != "time/step" and (k.startswith("time/") or "sync" in k or "wait" in k)
        )
        stale = ", ".join(f"{k.removeprefix('staleness/')} {v:g}" for k, v in r.items() if k.startswith("staleness/")) or "-"
        tok = 64 * NEW_TOKENS / r["time/step"]
        start = f"{r['serve_start_s']:.0f}" if "serve_start_s" in r else "-"
        lines.append(f"{head} {r['time/step']:.3f} | {tok:.0f} | {split} | {stale} | {start} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--engines", default="hf,vllm", help="server engines to run (in-process and local runs are always hf)")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians (start-up, first sync)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=300, help="runs not started by then are listed as not run")
    ap.add_argument("--serve-wait-s", type=float, default=150, help="how long a server may take to answer /health")
    ap.add_argument(
        "--vllm-serve-args",
        default="--gpu-memory-utilization 0.3 --enforce-eager",
        help="extra arguments for `rlvr serve --engine vllm` (one GPU shared with the trainer: a small share)",
    )
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu_servers.md")
    ap.add_argument("--work", type=Path, default=Path("/tmp/rlvr_servers"))
    a = ap.parse_args()
    a.dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
    a.work.mkdir(parents=True, exist_ok=True)
    import torch

    a.ngpu = torch.cuda.device_count() if a.device == "cuda" else 0
    # `timeout` sends SIGTERM: unwind, so the running server is stopped by one_run's finally
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    model = build_model("B", a.work)
    engines, end, results = a.engines.split(","), time.time() + a.budget_s, []
    for i, (label, engine, k, extra) in enumerate(RUNS):
        if engine and engine not in engines:
            continue
        left = end - time.time()
        if left < 30:
            results.append({"label": label, "engine": engine or "hf", "k": k, "skipped": f"--budget-s {a.budget_s:.0f} spent"})
            continue
        results.append(one_run(i, label, engine, k, extra, model, a, left))
        print(json.dumps(results[-1]), flush=True)
        write(results, a, torch)  # after every run: a hard timeout still leaves the runs done


def write(results: list[dict], a, torch) -> None:
    if a.device == "cuda":
        where = "server on GPU 1, trainer on GPU 0" if a.ngpu >= 2 else "server and trainer share the one GPU"
        hw = f"{torch.cuda.get_device_name(0)} x {a.ngpu} ({where})"
    else:
        hw = f"CPU, {a.threads} threads per process"
    lines = [
        f"# Generation apart from training: rlvr serve on 127.0.0.1, k = 0 and 1 ({a.device})",
        "",
        f"Command: `python bench/servers.py {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Hardware: {hw}. torch {torch.__version__}, dtype {a.dtype}.  ",
        f"Each run: `rlvr train`, {a.steps} steps of 8 prompts x 8 completions, {NEW_TOKENS} new tokens each (EOS ignored), "
        f"bench/engines.py's model B (25M Llama, random weights); medians over steps {a.warmup + 1}-{a.steps}. "
        "A server is started for each run and stopped after it; k is rollout.max_staleness.",
        "",
        *table(results),
        "",
    ]
    a.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
