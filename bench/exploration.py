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

Arms (each the defaults plus; the defaults include Clip-Cov at 2 % since 2026-12-03, `plain` turns it off):
`clip_higher` algo.epsilon_high=0.28 (DAPO); `adaptive` algo.adaptive_entropy with
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
RESUME = False  # --resume
THREADS = 2  # --threads: torch threads per run (1 when two benches share the 2 cores)
MINUTES = 0.0  # --smollm2-minutes: SmolLM2 arms train for this wall time instead of a number of steps (0: steps)
AUTOCAST = "bf16"  # SmolLM2 arms: bench/smollm2.py's precision (twice as fast as fp32 on a bf16 CPU)
ARMS = {
    "defaults": [],
    # the defaults before 2026-12-03 (TRL's dapo loss, no remedy): Clip-Cov at 2 % is on by default since
    "plain": ["algo.clip_cov_ratio=0"],
    "clip_higher": ["algo.epsilon_high=0.28"],
    "adaptive": ["algo.adaptive_entropy=true"],  # + algo.entropy_target from the defaults arm
    # TRL's delta (0.005) ramps the coefficient to 0.2 in 40 steps, after a short run has collapsed; 4x faster:
    "adaptive_fast": ["algo.adaptive_entropy=true", "algo.entropy_coef_delta=0.02"],
    # adaptive_fast with the automatic target (half the run's own first 5 steps): a setting a default can carry
    "auto_target": ["algo.adaptive_entropy=true", "algo.entropy_coef_delta=0.02", "algo.entropy_target=null"],
    # ... with the coefficient capped: on tiny-tools auto_target's coefficient wound up to 0.7 under a collapsed entropy
    # (an entropy gradient near 0 cannot lift it), then broke the policy (reward 0.9 -> 0, entropy 0.02 -> 0.97)
    "auto_capped": [
        "algo.adaptive_entropy=true",
        "algo.entropy_coef_delta=0.02",
        "algo.entropy_target=null",
        "algo.entropy_coef_max=0.2",
    ],  # fmt: skip
    # a fixed target low enough to let the policy commit (auto_capped's ~0.36 kept long, cut answers) and high enough
    # to keep groups apart (on SmolLM2 the defaults fall below 50 % distinct completions near 0.25 nats)
    "target_03": ["algo.adaptive_entropy=true", "algo.entropy_coef_delta=0.02", "algo.entropy_target=0.3"],
    "clip_cov": ["algo.clip_cov_ratio=2e-4"],
    # the paper's 2e-4 detaches one token a step at these batch sizes (1-3k tokens, against the paper's millions);
    # 2 % detaches 20-60 a step (or every token whose covariance lies in (1, 5), where fewer do)
    "clip_cov_2pct": ["algo.clip_cov_ratio=0.02"],
    "kl_cov": ["algo.clip_cov_ratio=0", "algo.kl_cov_ratio=2e-4", "optim.steps_per_generation=2"],
    "spg2": ["algo.clip_cov_ratio=0", "optim.steps_per_generation=2"],  # KL-Cov's control: the same two optimizer steps per step, no remedy
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
    settings = [f"output_dir={out}", f"seed={seed}", f"steps={steps}", "eval.before_after=false", "logging.report_to=[]"]
    settings.append(f"threads={THREADS}")
    run = rlvr.train(str(REPO / "examples/tools-calculator.yaml"), *settings, *ARMS[arm], *extra, force=True, progress=False)
    wall = time.time() - t0
    greedy = rlvr.evaluate(run, task="multiplication", n=eval_n, quiet=True)
    sampled = rlvr.evaluate(run, task="multiplication", n=eval_n, samples=8, temperature=1.0, quiet=True)
    return summary(run.output_dir, wall, greedy, sampled)


# SmolLM2's held-out grading, as bench/smollm2.py grades: the first <answer> tag holds exactly the gold number.
STRICT = '''
import re


def strict_answer(prompts, completions, answer, **kwargs):
    """1 when the first <answer>...</answer> tag holds exactly the gold number, else 0."""
    out = []
    for c, gold in zip(completions, answer):
        text = c[0]["content"] if isinstance(c, list) else c
        m = re.search(r"<answer>(.*?)</answer>", text, re.S)
        out.append(1.0 if m and m.group(1).strip() == str(gold) else 0.0)
    return out
'''


def smollm2_data(work: Path, eval_n: int) -> dict[str, Path]:
    """bench/smollm2.py's training rows and its two held-out sets (same seeds), written once as JSONL."""
    import smollm2

    held_out = smollm2.problems(eval_n, seed=1)
    new = smollm2.problems(eval_n, seed=3, templates=smollm2.NEW_TEMPLATES, names=smollm2.NEW_NAMES)
    train = smollm2.problems(2000, seed=2, exclude={r["question"] for r in held_out})
    files = {"train": train, "in-template": held_out, "new phrasings": new}
    out = {}
    for name, rows in files.items():
        out[name] = work / f"smollm2-{name.replace(' ', '_')}.jsonl"
        out[name].write_text("".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n" for r in rows))
    (work / "smollm2_rewards.py").write_text(smollm2.REWARDS + STRICT)
    return out


def smollm2_arm(arm: str, seed: int, extra: list[str], work: Path, steps: int, eval_n: int) -> dict:
    """bench/smollm2.py's run (8 prompts x 8 completions, 48 new tokens, T=0.7, lr 1e-5, both rewards) for `steps`
    steps, then greedy accuracy on both held-out sets and pass@k (8 samples at the training temperature)."""
    import rlvr
    from rlvr.models.gguf import DEFAULT_CACHE, convert_gguf, smollm2_gguf

    if not (DEFAULT_CACHE / "config.json").exists():
        convert_gguf(smollm2_gguf(), DEFAULT_CACHE)
    files, rewards = smollm2_data(work, eval_n), work / "smollm2_rewards.py"
    out = work / f"smollm2-{arm}-s{seed}"
    settings = [
        f"model.path={DEFAULT_CACHE}", "data.task=null", f"data.path={files['train']}",
        f"rewards=[math, {rewards}:answer_tag]", "rewards.1.weight=0.5", "rollout.group_size=8",
        "rollout.prompts_per_step=8", "rollout.max_new_tokens=48", "rollout.temperature=0.7", "optim.lr=1e-5",
        "optim.micro_batch_size=16", f"model.autocast={AUTOCAST}", f"steps={steps}", "eval.before_after=false",
        "logging.report_to=[]", "log_completions_every=5", f"output_dir={out}", f"seed={seed}", f"threads={THREADS}",
    ]  # fmt: skip
    t0, earlier = time.time(), 0.0
    if MINUTES:  # the same wall time for every arm: as many steps as fit (the reviewers' comparison)
        from rlvr.training.checkpoint import latest_checkpoint

        train_for_minutes([*settings, "steps=100000", *ARMS[arm], *extra], MINUTES)
        run = latest_checkpoint(out / "checkpoints")  # a stopped run's weights: its checkpoint (no final/)
    elif RESUME and (out / "checkpoints").is_dir():  # --resume: the same run, continued from its checkpoint to `steps`
        earlier = sum(m["time/step"] for m in metrics(out))
        run = rlvr.train(None, f"steps={steps}", resume=out, progress=False)
    else:
        run = rlvr.train(None, *settings, *ARMS[arm], *extra, force=True, progress=False)
    wall = earlier + time.time() - t0
    strict = f"{rewards}:strict_answer"
    held = {}
    for name in ("in-template", "new phrasings"):
        held[name] = rlvr.evaluate(run, data=files[name], reward=strict, max_new_tokens=48, quiet=True)
    sampled = rlvr.evaluate(run, data=files["new phrasings"], reward=strict, max_new_tokens=48, samples=8, temperature=0.7, quiet=True)
    return summary(out, wall, held, sampled, correctness="math")


def train_for_minutes(overrides: list[str], minutes: float) -> None:
    """Train until the step that ends past `minutes` of wall time (then a checkpoint, as any stop)."""
    import torch

    from rlvr.config import load_config
    from rlvr.training import Trainer
    from rlvr.training.hooks import NoHooks

    class Budget(NoHooks):
        def train_begin(self, trainer) -> None:
            self.t0 = time.time()

        def step_end(self, trainer, metrics: dict) -> bool:
            return time.time() - self.t0 >= minutes * 60

    cfg = load_config(None, overrides)
    torch.set_num_threads(cfg.threads)  # as rlvr.train does (process-wide; the Trainer leaves it)
    Trainer(cfg, force=True, logger_live=False, hooks=Budget()).train()


def summary(run_dir: Path, wall: float, greedy, sampled, correctness: str | None = None) -> dict:
    """`greedy`: one EvalResult, or {held-out set: EvalResult}."""
    from rlvr.observe.doctor import diagnose_run

    ms = metrics(run_dir)
    held = greedy if isinstance(greedy, dict) else {"": greedy}
    findings = diagnose_run(run_dir, correctness=correctness)
    return {
        "steps": len(ms),
        "wall": wall,
        "greedy": {name: accuracy(round(r.score * r.rows), r.rows) for name, r in held.items()},
        "pass": {j: sampled.intervals[f"pass@{j}"] for j in (1, 8) if f"pass@{j}" in sampled.intervals},
        "entropy": early_late(ms, "entropy"),
        "distinct": early_late(ms, "distinct_completions"),
        "zero_std": early_late(ms, "frac_reward_zero_std"),
        "coef": early_late(ms, "entropy_coef"),
        "doctor": ", ".join(sorted({f.rule for f in findings})) or "no problems found",
        "curves": {"entropy": [m.get("entropy") for m in ms], "distinct": [m.get("distinct_completions") for m in ms]},
    }


def fmt_pair(p, f=".2f") -> str:
    return "-" if p is None else f"{p[0]:{f}} -> {p[1]:{f}}"


def interval(v) -> str:
    """(mean, low, high), an Interval or the list JSON keeps of it, as `0.456 [0.379, 0.534]`."""
    return "-" if v is None else f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def table(results: dict, temperature: float) -> list[str]:
    sets = next(iter(results.values()))["greedy"].keys() if results else []
    acc = " | ".join(f"held-out accuracy{', ' + name if name else ''} (greedy)" for name in sets)
    rows = [
        f"| arm | seed | {acc} | pass@1 (8 samples, T={temperature:g}) | pass@8 | entropy (nats) | distinct completions | "
        "identical-reward groups | entropy coef | doctor | steps | wall |",
        "|---|---|" + "---|" * len(sets) + "---|---|---|---|---|---|---|---|---|",
    ]
    for (arm, seed), r in results.items():
        greedy = " | ".join(f"{g['acc']:.3f} [{g['lo']:.3f}, {g['hi']:.3f}] ({g['k']}/{g['n']})" for g in r["greedy"].values())
        rows.append(
            f"| {arm} | {seed} | {greedy} | {interval(r['pass'].get(1))} | "
            f"{interval(r['pass'].get(8))} | {fmt_pair(r['entropy'], '.3f')} | {fmt_pair(r['distinct'], '.0%')} | "
            f"{fmt_pair(r['zero_std'], '.0%')} | {fmt_pair(r['coef'], '.3f')} | {r['doctor']} | {r['steps']} | {r['wall']:.0f} s |"
        )
    return rows


def curves(png: Path, runs: dict[tuple[str, int], Path], rows: dict | None = None) -> None:
    """Token entropy and distinct completions per group over the steps: one colour per arm, one line style per seed.
    From each run's metrics.jsonl, or from the curves its result row kept (runs whose folder is gone)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    arms = sorted({arm for arm, _ in runs}, key=list(ARMS).index)
    for (arm, seed), run in runs.items():
        kept = (rows or {}).get((arm, seed), {}).get("curves")
        if (run / "metrics.jsonl").exists():
            ms = metrics(run)
        elif kept:
            pairs = zip(kept["entropy"], kept["distinct"])
            ms = [{"step": i + 1, "entropy": e, "distinct_completions": d} for i, (e, d) in enumerate(pairs)]
        else:
            continue  # an older row: neither its folder nor its curves were kept
        style = {"color": f"C{arms.index(arm)}", "linestyle": ["-", "--", ":", "-."][seed % 4], "alpha": 0.8}
        for ax, key in zip(axes, ("entropy", "distinct_completions")):
            ax.plot([m["step"] for m in ms], [m.get(key, float("nan")) for m in ms], label=f"{arm} s{seed}", **style)
    for ax, label in zip(axes, ("token entropy (nats)", "distinct completions per group")):
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


TINY = "tiny-tools, multiplication with a calculator (examples/tools-calculator.yaml; held-out: `--task multiplication`)"
SMOLLM2 = (
    "SmolLM2-135M-Instruct, word problems (bench/smollm2.py's task; held out: problems in the training phrasings and in "
    "new phrasings, strict grading; pass@k on the new phrasings)"
)
TASKS = {  # task: (arm runner, steps option, eval size option, pass@k temperature, heading)
    "tiny": (tiny_arm, "tiny_steps", "tiny_eval", 1.0, TINY),
    "smollm2": (smollm2_arm, "smollm2_steps", "smollm2_eval", 0.7, SMOLLM2),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="tiny", help="comma-separated: " + ", ".join(TASKS))
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--tiny-steps", type=int, default=80)
    ap.add_argument("--tiny-eval", type=int, default=300)
    ap.add_argument("--smollm2-steps", type=int, default=40)
    ap.add_argument("--smollm2-eval", type=int, default=100)
    ap.add_argument("--smollm2-minutes", type=float, default=0.0, help="train each SmolLM2 arm this long instead of --smollm2-steps")
    ap.add_argument("--entropy-target", type=float, default=0.2, help="adaptive arms without a defaults arm before them")
    ap.add_argument("--work", type=Path, default=Path("runs/exploration-bench"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/exploration.md"))
    ap.add_argument("--add", action="store_true", help="keep the arms already in --out's JSON (more seeds or arms later)")
    ap.add_argument("--resume", action="store_true", help="smollm2: continue each arm's run in --work to the new step count")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per run")
    ap.add_argument("--merge", default="", help="comma-separated JSONs of runs made beside this one (other --out), merged in")
    a = ap.parse_args()
    global RESUME, THREADS, MINUTES
    RESUME, THREADS, MINUTES = a.resume, a.threads, a.smollm2_minutes
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(REPO / "bench"))
    tasks, seeds, arms = a.tasks.split(","), [int(s) for s in a.seeds.split(",") if s], [x for x in a.arms.split(",") if x]
    unknown = [t for t in tasks if t not in TASKS] + [x for x in arms if x not in ARMS]
    if unknown:
        raise SystemExit(f"unknown task or arm: {', '.join(unknown)} (tasks: {', '.join(TASKS)}; arms: {', '.join(ARMS)})")
    a.work.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = (
        f"python bench/exploration.py --tasks {a.tasks} --seeds {a.seeds} --arms {a.arms} --tiny-steps {a.tiny_steps} "
        f"--smollm2-steps {a.smollm2_steps}{' --add' if a.add else ''}{' --resume' if a.resume else ''}"
        f"{f' --threads {a.threads}' if a.threads != 2 else ''}{f' --merge {a.merge}' if a.merge else ''}"
        f"{f' --smollm2-minutes {a.smollm2_minutes:g}' if a.smollm2_minutes else ''}` "
        f"(started {started}; {cpu_name()}, {a.threads} threads per run"
    )
    results, commands = load(a.out.with_suffix(".json")) if a.add else ({}, [])
    for other in filter(None, a.merge.split(",")):  # parallel runs' results, each with its own commands
        more, more_commands = load(Path(other))
        commands += more_commands
        for task, rows in more.items():
            results.setdefault(task, {}).update(rows)
    commands.append(command)
    for task in tasks:
        results.setdefault(task, {})
    if not arms:  # --arms "": only merge and rewrite the report
        write(a, commands, results)
    for task in tasks:
        run_arm, steps, eval_n = TASKS[task][0], getattr(a, TASKS[task][1]), getattr(a, TASKS[task][2])
        for seed in seeds:
            for arm in arms:
                extra = []
                if arm.startswith("adaptive"):  # half the entropy the defaults arm of this seed started at
                    base = results[task].get(("defaults", seed))
                    target = max(0.05, base["entropy"][0] / 2) if base and base["entropy"] else a.entropy_target
                    extra = [f"algo.entropy_target={target:.3g}"]
                results[task][(arm, seed)] = run_arm(arm, seed, extra, a.work, steps, eval_n)
                print(task, table({(arm, seed): results[task][(arm, seed)]}, TASKS[task][3])[-1], flush=True)
                write(a, commands, results)


def load(path: Path) -> tuple[dict, list[str]]:
    """The results and commands an earlier run wrote to `path` (--add)."""
    saved = json.loads(path.read_text()) if path.exists() else {}
    results = {}
    for task, rows in saved.get("results", {}).items():
        results[task] = {}
        for key, r in rows.items():
            arm, seed = key.rsplit("/s", 1)
            results[task][(arm, int(seed))] = r | {"pass": {int(k): v for k, v in r["pass"].items()}}
    return results, saved.get("commands", [])


def write(a, commands: list[str], results: dict) -> None:
    lines = [
        "# Exploration: today's defaults against the entropy remedies",
        "",
        *[f"Command: `{c}{'' if 'threads' in c else f'; {cpu_name()}, 2 threads'}, arms one after the other)." for c in commands],
    ]
    for task, rows in results.items():
        budget = f"{getattr(a, TASKS[task][1])} steps"
        if task == "smollm2" and a.smollm2_minutes:
            budget = f"{a.smollm2_minutes:g} minutes of training per arm (its steps: the table's)"
        png = a.out.with_name(f"{a.out.stem}_{task}.png")
        curves(png, {key: a.work / f"{task}-{key[0]}-s{key[1]}" for key in rows}, rows)
        lines += [
            "",
            f"## {TASKS[task][4]}, {budget}",
            "",
            *table(rows, TASKS[task][3]),
            "",
            f"![entropy and distinct completions]({png.name})",
        ]
    lines += [
        "",
        "Entropy, distinct completions, identical-reward groups and the coefficient: mean of the first 5 steps -> mean of the "
        "last 5. Intervals: 95 % (Wilson for accuracy; pass@k: the interval rlvr eval prints).",
    ]
    a.out.write_text("\n".join(lines) + "\n")
    saved = {task: {f"{arm}/s{seed}": r for (arm, seed), r in rows.items()} for task, rows in results.items()}
    a.out.with_suffix(".json").write_text(json.dumps({"commands": commands, "results": saved}, indent=1))


if __name__ == "__main__":
    main()
