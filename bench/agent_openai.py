"""The calculator agent of examples/agent_openai.py (only the `openai` client, unchanged) trained through
rlvr's OpenAI-compatible endpoint on models that call tools in tags, next to the same model trained through
`tools:` (rlvr's own multi-turn source) with the same steps, seed and settings.

    nice -n 19 python bench/agent_openai.py --out bench/results/agent_openai.md

(a) tiny-tools on `multiplication`, examples/tools-calculator.yaml as it is (80 steps), the agent arm with
    `tools.functions=[] rollout.agent=examples/agent_openai.py:calculator_agent rewards=[]` (the agent's reward);
(b) SmolLM2-135M-Instruct (`rlvr convert-gguf`), bench/smollm2_tools.py's word problems with its two worked
    examples as the row's earlier chat turns, a short fixed number of steps.

Every held-out score, before and after, for both arms, is `rlvr eval MODEL --agent examples/agent_openai.py:
calculator_agent` on the same problems with the same scorer (tiny-tools: the task's verifier; SmolLM2: the
first <answer> equals the product), the endpoint speaking the model's tags; 95 % Wilson intervals.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from _report import table_row, wilson  # noqa: E402
from smollm2_tools import REWARDS, TRAIN_NAMES, TRAIN_TEMPLATES, cpu, problems, tool_prompt, with_prompt  # noqa: E402

AGENT = f"{REPO / 'examples' / 'agent_openai.py'}:calculator_agent"
TAGS = ["--tool-format", "tags", "--tool-tags", "calculator=calc", "--no-tool-describe"]
SMOLLM2 = Path.home() / ".cache" / "rlvr" / "SmolLM2-135M-Instruct"
THREADS = 1  # --threads


def rlvr(*args: str, log: Path) -> tuple[str, float]:
    """`python -m rlvr ARGS` (this checkout), its stdout; stderr to `log`; an error stops the bench."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": str(THREADS)}
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "rlvr", *args], capture_output=True, text=True, env=env, cwd=REPO)
    log.write_text(f"$ rlvr {' '.join(args)}\n{p.stdout}\n{p.stderr}")
    if p.returncode != 0:
        raise SystemExit(f"rlvr {' '.join(args)} failed ({p.returncode}); see {log}\n{p.stderr[-3000:]}")
    return p.stdout, time.time() - t0


def score(stdout: str, n: int) -> dict:
    """The last line of `rlvr eval`: `... (N problems, ...): 0.123`."""
    value = float(stdout.strip().splitlines()[-1].rsplit(" ", 1)[1])
    k = round(value * n)
    return {"n": n, "k": k, "acc": k / n, "ci": wilson(k, n)}


def cell(s: dict) -> str:
    lo, hi = s["ci"]
    return f"{s['acc']:.3f} [{lo:.3f}, {hi:.3f}] ({s['k']}/{s['n']})"


def metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def first_last(ms: list[dict], key: str, k: int = 10) -> str:
    vals = [m[key] for m in ms if key in m]
    if not vals:
        return "-"
    k = min(k, max(1, len(vals) // 2))
    return f"{sum(vals[:k]) / k:.2f} -> {sum(vals[-k:]) / k:.2f}"


def arm_summary(ms: list[dict], agent: bool, wall: float) -> dict:
    calls = "agent/tool_calls_per_episode" if agent else "tools/call_frequency"
    reward = "rewards/agent/mean" if agent else None
    step = sorted(m["time/step"] for m in ms)[len(ms) // 2]
    return {"steps": len(ms), "calls": first_last(ms, calls), "reward": first_last(ms, reward or "reward"), "wall": wall, "step": step}


def tiny(args, work: Path) -> dict:
    """tiny-tools: examples/tools-calculator.yaml, as the `tools:` arm and as the agent arm."""
    n, out = args.tiny_eval, {}
    evals = ["--task", "multiplication", "--n", str(n), "--agent", AGENT]
    out["before"] = score(rlvr("eval", "tiny-tools", *evals, *TAGS, log=work / "tiny-before.log")[0], n)
    common = ["examples/tools-calculator.yaml", f"steps={args.tiny_steps}", "eval_before_after=false", f"threads={THREADS}", "--force"]
    arms = {"tools": [], "agent": ["tools.functions=[]", f"rollout.agent={AGENT}", "rewards=[]"]}
    for arm, extra in arms.items():
        run = work / f"tiny-{arm}"
        _, wall = rlvr("train", *common, f"output_dir={run}", *extra, log=work / f"tiny-{arm}-train.log")
        out[arm] = arm_summary(metrics(run), arm == "agent", wall)
        out[arm]["after"] = score(rlvr("eval", str(run / "final"), *evals, *TAGS, log=work / f"tiny-{arm}-eval.log")[0], n)
        print(f"tiny {arm}: {out[arm]}", flush=True)
    return out


def smollm2(args, work: Path) -> dict:
    """SmolLM2-135M-Instruct on bench/smollm2_tools.py's problems, its worked examples as the row's chat turns."""
    rows = with_prompt(problems(args.smollm2_train, 2, TRAIN_TEMPLATES, TRAIN_NAMES, held_out=False), tool_prompt)
    held = with_prompt(problems(args.smollm2_eval, 1, TRAIN_TEMPLATES, TRAIN_NAMES, held_out=True), tool_prompt)
    (work / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    (work / "rewards.py").write_text(REWARDS)
    n, out = len(held), {}
    evals = ["--data", str(work / "held.jsonl"), "--reward", f"{work / 'rewards.py'}:correct", "--agent", AGENT, "--max-new-tokens", "48"]
    out["before"] = score(rlvr("eval", str(SMOLLM2), *evals, *TAGS, log=work / "smollm2-before.log")[0], n)
    common = [
        f"model.path={SMOLLM2}", "data.task=null", f"data.path={work / 'train.jsonl'}", "tools.tags=[calculator=calc]",
        "tools.format=tags", "tools.describe=false", "tools.max_turns=2", "tools.timeout_s=5", "rollout.group_size=8",
        f"rollout.prompts_per_step={args.smollm2_prompts}", "rollout.max_new_tokens=48", "rollout.temperature=1.0", "optim.lr=1e-5",
        "optim.micro_batch_size=16", f"steps={args.smollm2_steps}", "seed=0", "eval_before_after=false", f"threads={THREADS}", "--force",
    ]  # fmt: skip
    r = work / "rewards.py"
    arms = {
        "tools": ["tools.functions=[calculator]", f"rewards=[{r}:correct, {r}:answer_tag]", "rewards.1.weight=0.25"],
        "agent": [f"rollout.agent={AGENT}", "rewards=[]"],
    }
    for arm, extra in arms.items():
        run = work / f"smollm2-{arm}"
        _, wall = rlvr("train", *common, f"output_dir={run}", *extra, log=work / f"smollm2-{arm}-train.log")
        out[arm] = arm_summary(metrics(run), arm == "agent", wall)
        out[arm]["after"] = score(rlvr("eval", str(run / "final"), *evals, *TAGS, log=work / f"smollm2-{arm}-eval.log")[0], n)
        print(f"smollm2 {arm}: {out[arm]}", flush=True)
    return out


def table(name: str, res: dict) -> list[str]:
    lines = [
        f"### {name}",
        "",
        "| arm | held-out before | held-out after | steps | tool calls per episode (training; mean of the first -> last "
        "min(10, steps/2) steps) | training reward (same steps) | wall time of `rlvr train` | median step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, label in (("tools", "`tools:` (tools.functions=[calculator])"), ("agent", "`rollout.agent` (examples/agent_openai.py)")):
        a = res[arm]
        timing = (f"{a['wall']:.0f} s", f"{a['step']:.1f} s")
        lines.append(table_row(label, cell(res["before"]), cell(a["after"]), a["steps"], a["calls"], a["reward"], *timing))
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--tiny-steps", type=int, default=80)
    ap.add_argument("--tiny-eval", type=int, default=300)
    ap.add_argument("--smollm2-steps", type=int, default=4)
    ap.add_argument("--smollm2-prompts", type=int, default=4, help="prompts per step (x 8 episodes)")
    ap.add_argument("--smollm2-eval", type=int, default=100)
    ap.add_argument("--smollm2-train", type=int, default=1000)
    ap.add_argument("--work", type=Path, default=REPO / "runs" / "agent-openai-bench")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process (2 cores shared: 1 stalls least)")
    args = ap.parse_args()
    global THREADS
    THREADS = args.threads
    args.work.mkdir(parents=True, exist_ok=True)
    started, res = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), {}
    for name, run in (("tiny", tiny), ("smollm2", smollm2)):
        if name in args.models:
            res[name] = run(args, args.work)
            write(args, started, res)  # what is done so far, should a later model not finish


def write(args, started: str, res: dict) -> None:
    shown = [a for i, a in enumerate(sys.argv[1:]) if a not in ("--out", "--work") and (i == 0 or sys.argv[i] not in ("--out", "--work"))]
    cmd = " ".join(["nice -n 19 python bench/agent_openai.py", *shown])
    lines = [
        "# An `openai`-client agent trained through rlvr's endpoint on tag-calling models",
        "",
        f"Command: `{cmd}` (started {started}, written {time.strftime('%H:%M UTC', time.gmtime())})  ",
        f"Machine: {cpu()}; {args.threads} torch thread(s) per process, runs one after the other, at nice 19 next to other "
        "work on the machine (the wall times are contended).  ",
        "Scorer, the same for every cell: `rlvr eval MODEL --agent examples/agent_openai.py:calculator_agent --tool-format tags "
        "--tool-tags calculator=calc --no-tool-describe` (the agent's own sampling: temperature 1, max_tokens 64, up to 4 requests), "
        "95 % Wilson intervals.",
        "",
    ]
    if "tiny" in res:
        held = f"held-out: `--task multiplication --n {args.tiny_eval}`, the task's verifier"
        lines += table(f"tiny-tools, multiplication ({held})", res["tiny"])
    if "smollm2" in res:
        lines += table(
            f"SmolLM2-135M-Instruct, word problems ({args.smollm2_eval} held-out problems, training phrasings; the first <answer> "
            f"equals the product; {args.smollm2_prompts} prompts x 8 episodes per step)",
            res["smollm2"],
        )
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
