"""Every training path for a few steps on one device: on a GPU, the paths the CPU test suite covers but
no GPU has run (bench/results/gpu_all.md: the first GPU run failed at step 1 on a CPU/GPU tensor mix
that no CPU test could see). Each path is its own `rlvr train` (3 steps of 8 prompts x 4 completions,
the bundled tiny models, doctor and completion tables every step), --parallel of them at once; a
path passes when every command exits 0 and its metrics hold finite losses.

    python bench/gpu_paths.py --device cuda                      # -> bench/results/gpu_paths.md
    python bench/gpu_paths.py --device cpu --only default,lora   # the script itself, on CPU
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ["model.path=tiny-tools", "data.task=multiplication", "tools.functions=[calculator]", "tools.tags=[calculator=calc]",
         "tools.format=tags", "tools.describe=false", "tools.max_turns=2", "rewards.0.fn=final_answer",
         "rollout.max_new_tokens=32"]  # fmt: skip
# name: commands, each the overrides of one `rlvr train` ("RUN": the path's output folder; "--resume RUN": resume it)
PATHS: dict[str, list[list[str]]] = {
    "default": [[]],
    "grpo loss, beta 0.04 (reference model)": [["algo.loss_type=grpo", "algo.beta=0.04"]],
    "num_iterations 2 (old log-probs)": [["algo.num_iterations=2"]],
    "sequence-level IS (GSPO)": [["algo.importance_sampling_level=sequence"]],
    "dynamic sampling": [["algo.dynamic_sampling=true"]],
    "mask truncated, top entropy 0.5, KL-Cov": [
        ["algo.mask_truncated_completions=true", "algo.top_entropy_quantile=0.5", "algo.clip_cov_ratio=0", "algo.kl_cov_ratio=0.002"]
    ],
    "adaptive entropy": [["algo.adaptive_entropy=true"]],
    "LoRA r=8": [["model.lora.r=8"]],
    "gradient checkpointing, micro-batch 8, 2 steps per generation": [
        ["model.gradient_checkpointing=true", "optim.micro_batch_size=8", "optim.steps_per_generation=2"]
    ],
    "fp32 weights under bf16 autocast": [["model.dtype=float32", "model.autocast=bf16"]],
    "tools (tiny-tools calculator, 2 turns)": [TOOLS],
    "agent over the OpenAI endpoint": [[f"rollout.agent={ROOT / 'bench' / 'gpu_paths_agent.py'}:agent", "rollout.max_new_tokens=8"]],
    "eval every step, pass@4": [["eval.every=1", "eval.samples=4", "eval.size=32"]],
    "checkpoint, then --resume to step 4": [["checkpoint.every=1"], ["--resume", "RUN", "steps=4"]],
    "local generation server, max_staleness 1": [["rollout.max_staleness=1"]],
    "optim.compile=on": [["optim.compile=on"]],
    "rollout.compile=on": [["rollout.compile=on"]],
}
SHORT = {"default": "default", "lora": "LoRA r=8"}


def base(device: str, out: Path) -> list[str]:
    return [f"device={device}", "steps=3", "rollout.prompts_per_step=8", "rollout.group_size=4", "eval_before_after=false",
            "report_to=[]", "doctor_every=1", "log_completions_every=1", "data.eval_size=32", f"output_dir={out}"]  # fmt: skip


def run_path(name: str, commands: list[list[str]], a) -> dict:
    out = a.work / "".join(c if c.isalnum() else "_" for c in name)[:60]
    t0, logs = time.time(), []
    for overrides in commands:
        if overrides[:1] == ["--resume"]:
            cmd = [sys.executable, "-m", "rlvr", "train", *overrides[2:], "--resume", str(out)]
        else:
            dtype = [] if any(o.startswith("model.dtype=") for o in overrides) else [f"model.dtype={a.dtype}"]
            cmd = [sys.executable, "-m", "rlvr", "train", *base(a.device, out), *dtype, *overrides, "--force"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        logs.append(p.stdout + p.stderr)
        if p.returncode != 0:
            return {"name": name, "ok": False, "s": time.time() - t0, "why": f"exit {p.returncode}: " + _tail(p.stderr or p.stdout)}
    metrics = out / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    losses = [r.get("loss") for r in rows]
    if not rows or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
        return {"name": name, "ok": False, "s": time.time() - t0, "why": f"metrics.jsonl losses {losses}"}
    last = rows[-1]
    return {
        "name": name,
        "ok": True,
        "s": time.time() - t0,
        "steps": len(rows),
        "reward": last.get("reward"),
        "step_s": last.get("time/step"),
        "split": " / ".join(f"{last.get('time/' + k, float('nan')):.2f}" for k in ("generate", "reward", "train")),
    }


def _tail(text: str, n: int = 400) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return " / ".join(lines[-3:])[-n:].replace("|", "\\|")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--only", default="", help="comma-separated names or prefixes of paths (default: all)")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=150)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rlvr_gpu_paths"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu_paths.md")
    a = ap.parse_args()
    a.dtype = a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32")
    wanted = [SHORT.get(w.strip(), w.strip()) for w in a.only.split(",") if w.strip()]
    paths = {n: c for n, c in PATHS.items() if not wanted or any(n.startswith(w) for w in wanted)}
    t0, results = time.time(), []
    with ThreadPoolExecutor(a.parallel) as ex:  # the table is rewritten as each path ends: a cut run keeps what it did
        for done in as_completed([ex.submit(_safe, item, a) for item in paths.items()]):
            results.append(done.result())
            write(a, sorted(results, key=lambda r: list(paths).index(r["name"])), len(paths), time.time() - t0)
    print(a.out.read_text())


def write(a, results: list[dict], total: int, seconds: float) -> None:
    import torch

    where = torch.cuda.get_device_name(0) if a.device.startswith("cuda") and torch.cuda.is_available() else "CPU"
    lines = [
        f"# Every training path on {a.device} ({where})",
        "",
        f"Command: `python bench/gpu_paths.py --device {a.device}{' --only ' + a.only if a.only else ''} --parallel {a.parallel}` "
        f"({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, torch {torch.__version__}, {a.dtype}, {a.parallel} at once, "
        f"{seconds:.0f} s in all). {sum(r['ok'] for r in results)} of {len(results)} paths run pass"
        + ("." if len(results) == total else f"; {total - len(results)} not finished."),
        "",
        "| path | result | s | steps | reward (last) | s/step (last) | generate / reward / train s (last) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r["ok"]:
            lines.append(f"| {r['name']} | ok | {r['s']:.0f} | {r['steps']} | {r['reward']:.3f} | {r['step_s']:.2f} | {r['split']} |")
        else:
            lines.append(f"| {r['name']} | FAILED: {r['why']} | {r['s']:.0f} | | | | |")
    a.out.write_text("\n".join(lines) + "\n")


def _safe(item, a) -> dict:
    name, commands = item
    try:
        return run_path(name, commands, a)
    except subprocess.TimeoutExpired:
        return {"name": name, "ok": False, "s": a.timeout, "why": f"did not finish in {a.timeout:.0f}s"}


if __name__ == "__main__":
    main()
