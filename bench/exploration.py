"""Which remedy keeps GRPO exploring, measured: today's defaults against clip-higher, adaptive entropy control,
Clip-Cov and KL-Cov, on the same task and budget, several seeds each.

    python bench/exploration.py --tasks tiny --seeds 0,1 --out bench/results/exploration.md
    python bench/exploration.py --tasks smollm2 --seeds 0,1 --smollm2-steps 40 --out bench/results/exploration_smollm2.md

Tasks: `tiny` is examples/tools-calculator.yaml (tiny-tools learns to call a calculator on 3-digit products; held
out: the multiplication task's 300 problems); `smollm2` is bench/smollm2.py's word problems on SmolLM2-135M-Instruct
(held out: 100 problems in the training phrasings and 100 in new phrasings, strict grading). Every arm trains the
same number of steps (a step is the same work in every arm, but for Clip-Cov's and the adaptive bonus's few
percent), one after the other. Reported per arm and seed: held-out accuracy (greedy, the task's verifier, 95 %
Wilson interval), pass@1 and pass@8 (8 samples at temperature 1, unbiased estimator with intervals), token entropy
and distinct completions per group (mean of the first and of the last 5 steps), the share of groups with identical
rewards at the end, and the doctor's verdict.

Arms (each the defaults plus): `clip_higher` algo.epsilon_high=0.28 (DAPO); `adaptive` algo.adaptive_entropy with
TRL's coefficient settings and a target of half the entropy the defaults arm of that seed started at (the doctor's
proposal); `clip_cov` algo.clip_cov_ratio=2e-4 (bounds 1, 5: the paper's); `kl_cov` algo.kl_cov_ratio=2e-4
(coefficient 1: the paper's) with optim.steps_per_generation=2, since its penalty is 0 until the policy moves
within a step; `spg2` is that without KL-Cov (its control: two optimizer steps per step are more updates).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _report import cpu_name, wilson

REPO = Path(__file__).resolve().parents[1]
ARMS = {
    "defaults": [],
    "clip_higher": ["algo.epsilon_high=0.28"],
    "adaptive": ["algo.adaptive_entropy=true"],  # + algo.entropy_target from the defaults arm
    "clip_cov": ["algo.clip_cov_ratio=2e-4"],
    "kl_cov": ["algo.kl_cov_ratio=2e-4", "optim.steps_per_generation=2"],
    "spg2": ["optim.steps_per_generation=2"],  # KL-Cov's control: the same two optimizer steps per step, no remedy
}


def metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def early_late(ms: list[dict], key: str, k: int = 5) -> tuple[float, float] | None:
    vals = [m[key] for m in ms if isinstance(m.get(key), (int, float))]
    if not vals:
        return None
    k = min(k, max(1, len(vals) // 2))
    return sum(vals[:k]) / k, sum(vals[-k:]) / k


def accuracy(k: int, n: int) -> dict:
    lo, hi = wilson(k, n)
    return {"acc": k / n, "lo": lo, "hi": hi, "k": k, "n": n}


def tiny_arm(arm: str, seed: int, extra: list[str], work: Path, steps: int, eval_n: int) -> dict:
    import rlvr

    out = work / f"tiny-{arm}-s{seed}"
    t0 = time.time()
    settings = [f"output_dir={out}", f"seed={seed}", f"steps={steps}", "eval.before_after=false", "logging.report_to=[]", "threads=2"]
    run = rlvr.train(str(REPO / "examples/tools-calculator.yaml"), *settings, *ARMS[arm], *extra, force=True, progress=False)
    wall = time.time() - t0
    greedy = rlvr.evaluate(run, task="multiplication", n=eval_n, quiet=True)
    sampled = rlvr.evaluate(run, task="multiplication", n=eval_n, samples=8, temperature=1.0, quiet=True)
    return summary(run.output_dir, wall, greedy, sampled)


def summary(run_dir: Path, wall: float, greedy, sampled) -> dict:
    from rlvr.observe.doctor import diagnose_run

    ms = metrics(run_dir)
    k = round(greedy.score * greedy.rows)
    findings = diagnose_run(run_dir)
    return {
        "steps": len(ms),
        "wall": wall,
        "greedy": accuracy(k, greedy.rows),
        "pass": {j: sampled.intervals[f"pass@{j}"] for j in (1, 8) if f"pass@{j}" in sampled.intervals},
        "entropy": early_late(ms, "entropy"),
        "distinct": early_late(ms, "distinct_completions"),
        "zero_std": early_late(ms, "frac_reward_zero_std"),
        "coef": early_late(ms, "entropy_coef"),
        "doctor": ", ".join(sorted({f.rule for f in findings})) or "no problems found",
    }


def fmt_pair(p, f=".2f") -> str:
    return "-" if p is None else f"{p[0]:{f}} -> {p[1]:{f}}"


def table(results: dict) -> list[str]:
    rows = [
        "| arm | seed | held-out accuracy (greedy) | pass@1 (8 samples, T=1) | pass@8 | entropy (nats) | distinct completions | "
        "identical-reward groups | entropy coef | doctor | steps | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (arm, seed), r in results.items():
        g = r["greedy"]
        rows.append(
            f"| {arm} | {seed} | {g['acc']:.3f} [{g['lo']:.3f}, {g['hi']:.3f}] ({g['k']}/{g['n']}) | {r['pass'].get(1, '-')} | "
            f"{r['pass'].get(8, '-')} | {fmt_pair(r['entropy'], '.3f')} | {fmt_pair(r['distinct'], '.0%')} | "
            f"{fmt_pair(r['zero_std'], '.0%')} | {fmt_pair(r['coef'], '.3f')} | {r['doctor']} | {r['steps']} | {r['wall']:.0f} s |"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="tiny")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--tiny-steps", type=int, default=80)
    ap.add_argument("--tiny-eval", type=int, default=300)
    ap.add_argument("--work", type=Path, default=Path("runs/exploration-bench"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/exploration.md"))
    a = ap.parse_args()
    if "smollm2" in a.tasks.split(","):
        raise SystemExit("--tasks smollm2: not written yet (bench/smollm2.py's task with these arms is the next step)")
    sys.path.insert(0, str(REPO / "src"))
    seeds, arms = [int(s) for s in a.seeds.split(",")], a.arms.split(",")
    a.work.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results: dict = {}
    for seed in seeds:
        for arm in arms:
            extra = []
            if arm == "adaptive":  # half the entropy the defaults arm of this seed started at (TRL's 0.2 without one)
                base = results.get(("defaults", seed))
                target = max(0.05, base["entropy"][0] / 2) if base and base["entropy"] else 0.2
                extra = [f"algo.entropy_target={target:.3g}"]
            results[(arm, seed)] = tiny_arm(arm, seed, extra, a.work, a.tiny_steps, a.tiny_eval)
            print(table({(arm, seed): results[(arm, seed)]})[-1], flush=True)
            write(a, started, results)


def write(a, started: str, results: dict) -> None:
    lines = [
        "# Exploration: today's defaults against the entropy remedies",
        "",
        f"Command: `python bench/exploration.py --tasks {a.tasks} --seeds {a.seeds} --arms {a.arms} --tiny-steps {a.tiny_steps}` "
        f"(started {started}; {cpu_name()}, 2 threads, arms one after the other).",
        "",
        f"## tiny-tools, multiplication with a calculator (examples/tools-calculator.yaml, {a.tiny_steps} steps; held-out: "
        f"`--task multiplication --n {a.tiny_eval}`)",
        "",
        *table(results),
        "",
        "Entropy, distinct completions, identical-reward groups and the coefficient: mean of the first 5 steps -> mean of the "
        "last 5. Intervals: 95 % (Wilson for accuracy; pass@k: the interval rlvr eval prints).",
    ]
    a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
