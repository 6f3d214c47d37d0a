"""Two source trees side by side on one machine: is the second as fast as the first?

Runs `python -m rlvr train` with each tree's `src` first on PYTHONPATH, on the same configs, alternating the
trees round by round (before, after, after, before, ...), and reads the step times from metrics.jsonl (the
first `--warmup` steps left out). Noise is measured, not assumed: the spread of one tree's per-round medians.

    git worktree add /tmp/before <commit>
    python bench/speed_trees.py /tmp/before . --rounds 3 --out bench/results/redesign_speed.md

Configs (8 prompts x 8 completions per step, 2 threads, fp32, seed 0), as bench/compare_trl.py's:
  A      bundled `tiny` model on arithmetic, 16 new tokens, EOS ignored (every completion 16 tokens)
  B      25M Llama (hidden 512, 8 layers), char tokenizer, 64 new tokens, EOS ignored, digit_share reward
  tools  examples/tools-calculator.yaml (tiny-tools, multi-turn: calculator calls between turns), 8 prompts
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

COMMON = [
    "rollout.group_size=8",
    "rollout.prompts_per_step=8",
    "rollout.temperature=1.0",
    "optim.lr=1e-6",
    "algo.beta=0",
    "eval_before_after=false",
    "log_completions_every=0",
    "report_to=[]",
    "doctor_every=0",
    "seed=0",
    "threads=2",
    "model.autocast=none",
    "device=cpu",
]


def configs(steps: int) -> dict[str, list[str]]:
    import compare_trl

    paths = compare_trl.build_inputs(["B"])
    data = ["data.task=null", f"data.path={paths['data_False']}", "data.shuffle=false"]
    return {
        "A": ["model.path=tiny", "rollout.max_new_tokens=16", "rollout.ignore_eos=true", f"steps={steps}", *COMMON],
        "B": [
            f"model.path={paths['llama25m']}",
            *data,
            f"rewards=[{HERE / 'bench_rewards.py'}:digit_share]",
            "rollout.max_new_tokens=64",
            "rollout.ignore_eos=true",
            f"steps={steps}",
            *COMMON,
        ],
        "tools": ["examples/tools-calculator.yaml", "data.eval_size=20", f"steps={steps}", *COMMON],
    }


def run(tree: Path, overrides: list[str], out: Path) -> list[float]:
    """Step times (s) of one run of `rlvr train` from `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS="2", PYTHONWARNINGS="ignore")
    yaml_files = [o for o in overrides if o.endswith(".yaml")]
    cmd = [
        sys.executable,
        "-m",
        "rlvr",
        "train",
        *[str(HERE.parent / y) for y in yaml_files],
        f"output_dir={out}",
        *[o for o in overrides if o not in yaml_files],
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
    if p.returncode:
        raise SystemExit(f"{tree}: {' '.join(cmd)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return [json.loads(line)["time/step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--configs", default="A,B,tools")
    ap.add_argument("--out")
    args = ap.parse_args()
    from rlvr.models.precision_choice import cpu_model

    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    commits = {
        k: subprocess.run(["git", "-C", str(t), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        for k, t in trees.items()
    }
    cfgs = {k: v for k, v in configs(args.steps).items() if k in args.configs.split(",")}
    medians: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for name, overrides in cfgs.items():
                for which in order:
                    times = run(trees[which], overrides, Path(tmp) / f"{name}-{which}-{r}")[args.warmup :]
                    medians.setdefault((name, which), []).append(statistics.median(times))
                    print(f"round {r} {name:5s} {which:6s} median step {medians[(name, which)][-1]:.3f} s", flush=True)
    lines = [
        f"# Speed before and after: {commits['before']} vs {commits['after']}",
        "",
        f"`python bench/speed_trees.py BEFORE AFTER --rounds {args.rounds} --steps {args.steps} --warmup {args.warmup}` "
        f"on {cpu_model()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; the trees alternate round by round. "
        "Per round: the median of one run's step times (warm-up steps left out). Noise: the spread (max - min) of one "
        "tree's per-round medians, as a share of their median.",
        "",
        "| config | before: median of rounds | after: median of rounds | after / before | noise before | noise after |",
        "|---|---|---|---|---|---|",
    ]
    for name in cfgs:
        b, a = medians[(name, "before")], medians[(name, "after")]
        mb, ma = statistics.median(b), statistics.median(a)
        lines.append(
            f"| {name} | {mb:.3f} s ({', '.join(f'{x:.3f}' for x in b)}) | {ma:.3f} s ({', '.join(f'{x:.3f}' for x in a)}) "
            f"| {ma / mb:.3f} | {(max(b) - min(b)) / mb:.1%} | {(max(a) - min(a)) / ma:.1%} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
