"""Tool use learned on 2 CPU cores: the bundled tiny-tools model with a calculator (multiplication
it cannot do in its head) and in the guess-the-number environment.

    python bench/tools_demo.py                     # both -> bench/results/tools_demo.md
    python bench/tools_demo.py --only calculator

Each run is `rlvr train examples/<config>.yaml` in its own process; held-out numbers come from the
run's own greedy evaluation before and after training (summary.json), with 95% Wilson intervals,
and the tool metrics from metrics.jsonl (first and last five steps).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = {  # name: (config, training metrics shown, what the evaluation measures)
    "calculator": (
        "examples/tools-calculator.yaml",
        ["tools/call_frequency", "tools/failure_frequency", "rewards/final_answer/mean"],
        "held-out accuracy",
    ),
    "guess_number": (
        "examples/guess-number.yaml",
        ["tools/call_frequency", "episodes/turns", "rewards/GuessNumber/mean"],
        "success, every target of 1..30 once",
    ),
}


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def cpu() -> str:
    name = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
    flags = open("/proc/cpuinfo").read()
    return f"{name}, {os.cpu_count()} cpus" + (" (avx512_bf16)" if "avx512_bf16" in flags else "")


def run(name: str, config: str, keys: list[str], work: Path, extra: list[str]) -> dict:
    out = work / name
    cmd = [sys.executable, "-m", "rlvr", "train", config, f"output_dir={out}", "report_to=[]", *extra]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent)
    wall = time.time() - t0
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[:5], rows[-5:]
    trend = {
        k: (sum(r.get(k, float("nan")) for r in first) / len(first), sum(r.get(k, float("nan")) for r in last) / len(last)) for k in keys
    }
    return {
        "command": "rlvr train " + " ".join(cmd[4:5] + extra),
        "summary": summary,
        "steps": len(rows),
        "wall": wall,
        "trend": trend,
        "tail": proc.stdout.strip().splitlines()[-3:],
    }


def sampled_success(config: str, model_path: str, samples: int = 16) -> tuple[float, int]:
    """Held-out success with sampling at temperature 1 (`samples` episodes per held-out row): the
    environment's own reward for guess_number, the task's verifier otherwise."""
    import torch

    from rlvr.config import load_config
    from rlvr.rollout import SamplingParams
    from rlvr.rollout.sources import make_source
    from rlvr.training import Trainer
    from rlvr.training.collect import score
    from rlvr.rewards import RewardRunner
    from rlvr.config import RewardConfig

    torch.set_num_threads(2)
    work = tempfile.mkdtemp(prefix="rlvr-sampled-")
    cfg = load_config(
        str(HERE.parent / config), [f"model.path={model_path}", f"output_dir={work}", "report_to=[]", "eval_before_after=false"]
    )
    t = Trainer(cfg, force=True, logger_live=False)
    rows = t.task.eval_rows()
    src = make_source(
        cfg,
        t.engine,
        t.tokenizer,
        SamplingParams(n=samples, temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens),
        context_length=t.model.config.max_position_embeddings,
        device=t.device,
        precision=t.precision.autocast,
    )
    e = src.rollout(rows, list(range(len(rows))))
    runner = RewardRunner.from_config([RewardConfig(fn=t.task.reward, name="eval")])
    ok = score(runner, rows, e)[:, 0]
    return float(ok.nanmean()), len(ok)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=list(RUNS))
    ap.add_argument("--eval-size", type=int, default=None, help="override data.eval_size")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "tools_demo.md")
    ap.add_argument("--sampled", action="store_true", help="also held-out success with sampling, before and after")
    args = ap.parse_args()
    extra = [f"data.eval_size={args.eval_size}"] if args.eval_size else []
    work = Path(tempfile.mkdtemp(prefix="rlvr-tools-"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE.parent).stdout.strip()
    lines = [
        "# Tool use learned on 2 CPU cores",
        "",
        f"`python bench/tools_demo.py{' --eval-size ' + str(args.eval_size) if args.eval_size else ''}` at {commit}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}; CPU: {cpu()}; 2 threads per run, runs one after the other.",
        "Evaluation: the run's own greedy evaluation before and after training (calculator: problems never trained on; "
        "guess_number: every target of the range once, see rlvr.tasks.guess_number for why not a held-out split), "
        "95% Wilson intervals. Tool metrics: mean of the first and of the last five training steps (sampling at temperature 1).",
        "",
    ]
    for name in [args.only] if args.only else list(RUNS):
        config, keys, label = RUNS[name]
        r = run(name, config, keys, work, extra)
        s = r["summary"]
        n = _eval_rows(config, extra)
        b, a = s["eval_before"], s["eval_after"]
        (bl, bh), (al, ah) = wilson(b, n), wilson(a, n)
        lines += [
            f"## {name}",
            "",
            f"Command: `{r['command']}` ({r['steps']} steps, {s['train_seconds']:.0f} s of training, {r['wall']:.0f} s in all)",
            "",
            "| | before | after |",
            "|---|---|---|",
            f"| {label} (greedy, n={n}) | {b:.1%} [{bl:.1%}, {bh:.1%}] | **{a:.1%}** [{al:.1%}, {ah:.1%}] |",
        ]
        lines += [f"| {k} (training, first 5 / last 5 steps) | {x:.3f} | {y:.3f} |" for k, (x, y) in r["trend"].items()]
        if args.sampled:
            import yaml

            before_path = yaml.safe_load((HERE.parent / config).read_text())["model"]["path"]
            (sb, nb), (sa, na) = sampled_success(config, before_path), sampled_success(config, str(work / name / "final"))
            (sbl, sbh), (sal, sah) = wilson(sb, nb), wilson(sa, na)
            lines.append(
                f"| held-out success (sampled T=1, 16 per row, n={nb}; episodes of a row are not independent) | "
                f"{sb:.1%} [{sbl:.1%}, {sbh:.1%}] | **{sa:.1%}** [{sal:.1%}, {sah:.1%}] |"
            )
        lines += ["", "Last lines printed:", "", "```", *r["tail"], "```", ""]
        print("\n".join(lines[-12:]), flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


def _eval_rows(config: str, overrides: list[str]) -> int:
    """How many rows the run's evaluation plays (a task may have fewer than data.eval_size)."""
    from rlvr.config import load_config
    from rlvr.tasks import get_task

    cfg = load_config(str(HERE.parent / config), overrides)
    d = cfg.data
    return len(get_task(d.task, seed=cfg.seed, digits=d.digits, operators=d.operators, eval_size=d.eval_size).eval_rows())


if __name__ == "__main__":
    main()
