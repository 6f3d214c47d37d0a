"""Generation apart from training on this CPU: k = 0, 1, 2 (`rollout.max_staleness`), in-process and
through a local `rlvr serve`, for the demo (bundled tiny model, arithmetic, `rlvr train` defaults)
and for SmolLM2-135M-Instruct (bench/smollm2.py's model, prompts, rewards and held-out grading).

    PYTHONPATH=$PWD/src python bench/async.py --demo-steps 30 --demo-seeds 0 1 2 --smol-steps 6 \
        --out bench/results/async.md

Configurations (the same number of steps each):
  in-process k=0   today's path: the trainer's own hf engine, lockstep
  in-process k>0   no rollout.servers: the trainer starts a local generation process itself
  server k         rollout.servers=[URL] of an `rlvr serve MODEL --engine hf` this script starts

Per configuration: the step time split (from metrics.jsonl, first step of each run excluded, mean
+- sd over steps), throughput, held-out accuracy with a 95 % Wilson interval, staleness and rows
dropped, the CPU seconds of every process of the run (trainer and servers; robust to other load on
the machine, unlike wall time) and the load average around it. Then a table that PROJECTS the overlap
to separate generation devices from the measured shares: a projection, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from _report import table_row, wilson

HERE = Path(__file__).resolve().parent
CONFIGS = [("in-process", 0), ("in-process", 1), ("in-process", 2), ("server", 0), ("server", 1), ("server", 2)]
TIMES = [
    ("time/generate", "collect"),
    ("time/reward", "reward"),
    ("time/train", "train (incl. sync)"),
    ("weight_sync/seconds", "weight sync"),
    ("time/waiting_for_rollouts", "waiting for rollouts"),
    ("time/generator_waiting_for_weights", "generator waiting for weights"),
    ("time/step", "step"),
]
RECORDED = ("demo_steps", "demo_seeds", "smol_steps", "smol_eval_size", "budget_minutes")
SMOL = {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 32, "lr": 1e-5, "temperature": 0.7}


def cpu_seconds() -> float:
    """User + system CPU seconds of every child process waited for so far (their children included)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def machine() -> str:
    import torch

    info = Path("/proc/cpuinfo").read_text()
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    simd = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags) or "no avx2"
    return (
        f"CPU: {model} ({simd}), {os.cpu_count()} cores visible; torch {torch.__version__}, "
        f"torch.get_num_threads() = {torch.get_num_threads()} in every process (config `threads=0`: torch's default; the "
        "trainer and its generation server each use that many)"
    )


# ---------------------------------------------------------------------------- servers


def start_server(model: str, log: Path) -> tuple[subprocess.Popen, str]:
    sys.path.insert(0, str(HERE.parent / "src"))
    from rlvr.dist.transfer import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "rlvr", "serve", model, "--engine", "hf", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"rlvr serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url + "/health", timeout=5).read()
            return proc, url
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.3)


def stop_server(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_config(mode: str, k: int, model: str, work: Path, child_cmd) -> dict:
    """One run: a server first when `mode` is server, then the child command (given the URL or None); wall, CPU, load."""
    work.mkdir(parents=True, exist_ok=True)
    load0, cpu0, t0 = os.getloadavg()[0], cpu_seconds(), time.time()
    server, url = start_server(model, work / "server.log") if mode == "server" else (None, None)
    t_run = time.time()
    try:
        proc = subprocess.run(child_cmd(url), stdout=(work / "run.log").open("w"), stderr=subprocess.STDOUT)
    finally:
        stop_server(server)
    if proc.returncode:
        raise RuntimeError(f"{mode} k={k}: exit {proc.returncode}; see {work / 'run.log'}:\n{(work / 'run.log').read_text()[-3000:]}")
    stats = {"wall_s": time.time() - t_run, "cpu_s": cpu_seconds() - cpu0, "load": (load0, os.getloadavg()[0]), "all_s": time.time() - t0}
    (work / "bench.json").write_text(json.dumps(stats))
    return stats


# ---------------------------------------------------------------------------- the demo


def demo_run(mode: str, k: int, seed: int, steps: int, work: Path) -> dict:
    out = work / f"demo-{mode}-k{k}-s{seed}"

    def cmd(url):
        args = [
            sys.executable,
            "-m",
            "rlvr",
            "train",
            f"seed={seed}",
            f"steps={steps}",
            f"rollout.max_staleness={k}",
            f"output_dir={out / 'run'}",
        ]
        return args + ([f"rollout.servers=[{url}]"] if url else []) + ["--force"]

    res = run_config(mode, k, "tiny", out, cmd)
    summary = json.loads((out / "run" / "summary.json").read_text())
    metrics = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    n = summary["eval_rows"]
    res.update(metrics=metrics, n=n, correct=round(summary["eval_after"] * n), before=summary["eval_before"], seed=seed)
    res["train_s"] = summary["train_seconds"]
    return res


# ---------------------------------------------------------------------------- SmolLM2


def smol_prepare(work: Path, eval_size: int) -> dict:
    """bench/smollm2.py's data: held-out problems (seed 1), training problems (seed 2) without them, its rewards file."""
    import smollm2

    sys.path.insert(0, str(HERE.parent / "src"))
    from rlvr.models.gguf import DEFAULT_CACHE, convert_gguf, smollm2_gguf

    if not (DEFAULT_CACHE / "config.json").exists():
        convert_gguf(smollm2_gguf(), DEFAULT_CACHE)
    work.mkdir(parents=True, exist_ok=True)
    held_out = smollm2.problems(eval_size, seed=1)
    train = smollm2.problems(2000, seed=2, exclude={r["question"] for r in held_out})
    (work / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (work / "held_out.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held_out))
    (work / "rewards.py").write_text(smollm2.REWARDS)
    return {"model": str(DEFAULT_CACHE), "work": str(work)}


def smol_run(mode: str, k: int, steps: int, data: dict, before: bool) -> dict:
    out = Path(data["work"]) / f"smol-{mode}-k{k}"

    def cmd(url):
        spec = {**data, "k": k, "steps": steps, "url": url, "out": str(out), "before": before}
        return [sys.executable, str(Path(__file__).resolve()), "--smol-child", json.dumps(spec)]

    res = run_config(mode, k, data["model"], out, cmd)
    child = json.loads((out / "result.json").read_text())
    metrics = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    res.update(child, metrics=metrics)
    return res


def smol_child(spec: dict) -> None:
    """In a fresh process: `steps` GRPO steps on SmolLM2 (smollm2.py's setup, smaller batches), then its strict
    held-out grading with the trainer's own weights on an in-process hf engine (the same for every configuration)."""
    import smollm2
    from rlvr.config import load_config
    from rlvr.observe.console import RunLogger
    from rlvr.rollout.engines.hf import HFEngine
    from rlvr.training import Trainer

    work, out = Path(spec["work"]), Path(spec["out"])
    s = SMOL
    overrides = [
        f"model.path={spec['model']}",
        "model.autocast=none",  # this CPU has no native bf16 (bench/results/smollm2.md)
        "data.task=null",
        f"data.path={work / 'train.jsonl'}",
        f"rewards=[math, {work / 'rewards.py'}:answer_tag]",
        "rewards.1.weight=0.5",
        f"rollout.group_size={s['group_size']}",
        f"rollout.prompts_per_step={s['prompts_per_step']}",
        f"rollout.max_new_tokens={s['max_new_tokens']}",
        f"rollout.temperature={s['temperature']}",
        f"optim.lr={s['lr']}",
        f"optim.micro_batch_size={s['group_size'] * s['prompts_per_step']}",
        f"steps={spec['steps']}",
        "eval_before_after=false",
        "checkpoint.every=0",
        f"output_dir={out / 'run'}",
        f"rollout.max_staleness={spec['k']}",
        *([f"rollout.servers=[{spec['url']}]"] if spec["url"] else []),
    ]
    cfg = load_config(None, overrides)
    trainer = Trainer(cfg, logger_live=False, force=True)
    held_out = [json.loads(x) for x in (work / "held_out.jsonl").read_text().splitlines()]
    grader = type("Grader", (), {"tokenizer": trainer.tokenizer, "engine": HFEngine(trainer.model, trainer.tokenizer)})()
    result: dict = {}
    if spec["before"]:
        result["before"] = smollm2.evaluate(grader, held_out, s["max_new_tokens"])
    (out / "run").mkdir(parents=True, exist_ok=True)
    log = RunLogger(out / "run", cfg.steps, 0, live=False, config=cfg)
    t0 = time.time()
    for _ in range(cfg.steps):
        log.log(trainer.train_step())
    result["train_s"] = time.time() - t0
    log.close()
    if trainer.apart is not None:  # stop the rollouts made ahead and the local server before grading
        trainer.apart.close()
    after = smollm2.evaluate(grader, held_out, s["max_new_tokens"])
    result.update(n=after["n"], correct=round(after["accuracy"] * after["n"]), format=after["format"], example=after["examples"][0])
    (out / "result.json").write_text(json.dumps(result, default=list))


def collect(work: Path, seeds: list[int]) -> tuple[dict, dict, list[int]]:
    """The runs that finished under `work` (a run stopped midway), read back from their folders; a run without
    bench.json (made before it was written) has no wall/CPU/load numbers."""
    none = {"wall_s": None, "cpu_s": None, "load": None}

    def stats(d: Path) -> dict:
        return json.loads((d / "bench.json").read_text()) if (d / "bench.json").exists() else dict(none)

    def lines(f: Path) -> list[dict]:
        return [json.loads(x) for x in f.read_text().splitlines()]

    demo: dict = {}
    for mode, k in CONFIGS:
        for seed in seeds:
            d = work / f"demo-{mode}-k{k}-s{seed}"
            if (d / "run" / "summary.json").exists():
                sm = json.loads((d / "run" / "summary.json").read_text())
                run = {**stats(d), "metrics": lines(d / "run" / "metrics.jsonl"), "n": sm["eval_rows"], "seed": seed}
                run.update(correct=round(sm["eval_after"] * sm["eval_rows"]), before=sm["eval_before"], train_s=sm["train_seconds"])
                demo.setdefault((mode, k), []).append(run)
    smol = {}
    for mode, k in CONFIGS:
        d = work / "smol" / f"smol-{mode}-k{k}"
        if (d / "result.json").exists():
            smol[(mode, k)] = [{**stats(d), **json.loads((d / "result.json").read_text()), "metrics": lines(d / "run" / "metrics.jsonl")}]
    done = sorted({r["seed"] for runs in demo.values() for r in runs})
    return demo, smol, done


# ---------------------------------------------------------------------------- numbers


def steady(runs: list[dict], key: str) -> list[float]:
    """`key` over every step but each run's first (absent keys, e.g. waits of k=0, are 0)."""
    return [float(m.get(key) or 0.0) for r in runs for m in r["metrics"][1:]]


def mean_sd(xs: list[float]) -> tuple[float, float]:
    return (statistics.fmean(xs), statistics.stdev(xs)) if len(xs) > 1 else (xs[0] if xs else float("nan"), 0.0)


def fmt(xs: list[float]) -> str:
    m, sd = mean_sd(xs)
    return f"{m:.3f} ± {sd:.3f}"


def throughput(runs: list[dict], per_step: int) -> tuple[float, float]:
    """Completions/s and completion tokens/s over the steady steps: what was made / the trainer's step time."""
    secs = sum(steady(runs, "time/step"))
    toks = sum(per_step * m["completions/mean_length"] for r in runs for m in r["metrics"][1:])
    return per_step * len(steady(runs, "time/step")) / secs, toks / secs


def accuracy(runs: list[dict]) -> str:
    """Each run's held-out accuracy with its Wilson interval (one per seed)."""
    return "; ".join(
        f"{r['correct'] / r['n']:.3f} [{wilson(r['correct'], r['n'])[0]:.3f}, {wilson(r['correct'], r['n'])[1]:.3f}]" for r in runs
    )


def loads(xs: list) -> str:
    return "; ".join(f"{a:.1f}->{b:.1f}" for a, b in xs)


def known(runs: list[dict], key: str, show) -> str:
    """show(values) of `key`, or n/a when a run lacks it (collected from folders written before it was recorded)."""
    xs = [r.get(key) for r in runs]
    return "n/a" if any(x is None for x in xs) else show(xs)


def tables(title: str, results: dict, per_step: int) -> list[str]:
    keys = list(results)
    head = "| | " + " | ".join(f"{m} k={k}" for m, k in keys) + " |"
    rule = "|---" * (len(keys) + 1) + "|"
    rows = [f"### {title}", "", "Seconds per step, mean ± sd over steps (first step of each run excluded):", "", head, rule]
    for key, label in TIMES:
        rows.append(table_row(label, *[fmt(steady(results[c], key)) for c in keys]))
    rows.append(
        table_row(
            "train less sync",
            *[fmt([a - b for a, b in zip(steady(results[c], "time/train"), steady(results[c], "weight_sync/seconds"))]) for c in keys],
        )
    )
    tp = {c: throughput(results[c], per_step) for c in keys}
    rows += [
        "",
        "| | " + " | ".join(f"{m} k={k}" for m, k in keys) + " |",
        rule,
        table_row("completions/s", *[f"{tp[c][0]:.1f}" for c in keys]),
        table_row("completion tokens/s", *[f"{tp[c][1]:.0f}" for c in keys]),
        table_row("throughput vs in-process k=0 (measured)", *[f"{tp[c][0] / tp[keys[0]][0]:.2f}x" for c in keys]),
        table_row("held-out accuracy after, 95 % Wilson (one per seed)", *[accuracy(results[c]) for c in keys]),
        table_row("staleness mean", *[f"{statistics.fmean(steady(results[c], 'staleness/mean') or [0]):.2f}" for c in keys]),
        table_row("staleness max", *[f"{max(steady(results[c], 'staleness/max') or [0]):.0f}" for c in keys]),
        table_row(
            "rows dropped as too stale (all steps)",
            *[f"{sum(float(m.get('rollout/stale_dropped') or 0) for r in results[c] for m in r['metrics']):.0f}" for c in keys],
        ),
        table_row("weight sync MB per step", *[f"{statistics.fmean(steady(results[c], 'weight_sync/bytes')) / 1e6:.1f}" for c in keys]),
        table_row("training seconds per run (all steps)", *[fmt([r["train_s"] for r in results[c]]) for c in keys]),
        table_row("CPU seconds, all processes, per run", *[known(results[c], "cpu_s", fmt) for c in keys]),
        table_row("wall seconds per run (start to exit)", *[known(results[c], "wall_s", fmt) for c in keys]),
        table_row("load average 1 min, before -> after", *[known(results[c], "load", loads) for c in keys]),
        "",
    ]
    return rows


def projection(title: str, results: dict) -> list[str]:
    """From in-process k=0 (generate G, reward R, train T) and server k=0 (sync S, the trainer idle meanwhile)."""
    G = statistics.fmean(steady(results[("in-process", 0)], "time/generate"))
    R = statistics.fmean(steady(results[("in-process", 0)], "time/reward"))
    T = statistics.fmean(steady(results[("in-process", 0)], "time/train"))
    where = ("server", 0) if ("server", 0) in results else ("in-process", 1)
    S = statistics.fmean(steady(results[where], "weight_sync/seconds"))
    rows = [
        f"### {title}: PROJECTION (computed, not measured)",
        "",
        f"Inputs, measured here: generate G = {G:.3f} s, reward R = {R:.3f} s, train T = {T:.3f} s (in-process k=0), "
        f"weight sync S = {S:.3f} s ({where[0]} k={where[1]}, gloo over loopback"
        + ("; includes waiting for the server's batch in flight: an upper bound" if where[1] else "")
        + f"). Generation share of the lockstep step: {G / (G + R + T):.0%}.",
        "",
        "| setting | step time model | projected s/step | vs colocated k=0 |",
        "|---|---|---|---|",
    ]
    base = G + R + T
    for name, model, t in [
        ("colocated, k=0 (today)", "G + R + T", base),
        ("separate generation device, k=0", "G + R + T + S", base + S),
        ("separate generation device, k=1", "max(G, R + T) + S", max(G, R + T) + S),
        ("separate generation device, k=2", "max(G, R + T + S)", max(G, R + T + S)),
        ("separate, k>=1, sync free (fast NCCL link)", "max(G, R + T)", max(G, R + T)),
    ]:
        rows.append(table_row(name, f"`{model}`", f"{t:.3f}", f"{base / t:.2f}x"))
    return rows + [""]


# ---------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo-steps", type=int, default=15)
    ap.add_argument("--demo-seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--smol-steps", type=int, default=3, help="0 skips SmolLM2")
    ap.add_argument("--smol-eval-size", type=int, default=32)
    ap.add_argument("--budget-minutes", type=float, default=24.0, help="demo seeds after the first run only while within this")
    ap.add_argument("--work", type=Path, default=Path("runs/async-bench"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/async.md"))
    ap.add_argument("--report-only", action="store_true", help="rewrite --out from WORK/results.json, running nothing")
    ap.add_argument("--collect", action="store_true", help="write --out from the finished runs under WORK (after a stopped run)")
    ap.add_argument("--smol-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smol_child:
        return smol_child(json.loads(args.smol_child))
    if args.report_only:
        raw = json.loads((args.work / "results.json").read_text())
        demo, smol = ({tuple(c[0]): c[1] for c in raw[part]} for part in ("demo", "smol"))
        vars(args).update(raw["args"])  # the command that measured them
        return write_report(args, demo, smol, raw["seeds"], raw["started"], raw["minutes"])
    if args.collect:
        demo, smol, seeds = collect(args.work, args.demo_seeds)
        return write_report(args, demo, smol, seeds, "see the run folders", float("nan"))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")] if p)
    t_start, started = time.time(), time.strftime("%Y-%m-%d %H:%M")
    demo: dict = {c: [] for c in CONFIGS}
    smol: dict = {}
    seeds_done, seed_minutes = [], []

    def demo_seed(seed):
        t0 = time.time()
        for mode, k in CONFIGS:
            print(f"demo {mode} k={k} seed {seed}", flush=True)
            demo[(mode, k)].append(demo_run(mode, k, seed, args.demo_steps, args.work))
        seeds_done.append(seed)
        seed_minutes.append((time.time() - t0) / 60)

    demo_seed(args.demo_seeds[0])
    if args.smol_steps:
        data = smol_prepare(args.work / "smol", args.smol_eval_size)
        for i, (mode, k) in enumerate(CONFIGS):
            print(f"smollm2 {mode} k={k}", flush=True)
            smol[(mode, k)] = [smol_run(mode, k, args.smol_steps, data, before=i == 0)]
    for seed in args.demo_seeds[1:]:
        spent = (time.time() - t_start) / 60
        if spent + max(seed_minutes) > args.budget_minutes:  # another seed would take about as long as the slowest so far
            print(f"skipping demo seed {seed}: {spent:.1f} min spent of {args.budget_minutes:g}", flush=True)
            continue
        demo_seed(seed)
    raw = {
        "demo": list(demo.items()),
        "smol": list(smol.items()),
        "seeds": seeds_done,
        "started": started,
        "args": {k: getattr(args, k) for k in RECORDED},
    }
    (args.work / "results.json").write_text(json.dumps({**raw, "minutes": (time.time() - t_start) / 60}, default=list))
    write_report(args, demo, smol, seeds_done, started, (time.time() - t_start) / 60)


def write_report(args, demo: dict, smol: dict, seeds: list[int], started: str, minutes: float) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    command = (
        f"PYTHONPATH=$PWD/src python bench/async.py --demo-steps {args.demo_steps} --demo-seeds {' '.join(map(str, args.demo_seeds))} "
        f"--smol-steps {args.smol_steps} --smol-eval-size {args.smol_eval_size} --budget-minutes {args.budget_minutes:g}"
        + (f" --out {args.out}" if args.out != Path("bench/results/async.md") else "")
    )
    demo_before = demo[("in-process", 0)][0]["before"]
    lines = [
        "# Generation apart from training on 2 CPU cores: k = 0, 1, 2, in-process and through a local server",
        "",
        f"Command: `{command}` (started {started}, commit {commit}, "
        + (
            f"{minutes:.1f} min in all)."
            if minutes == minutes
            else "stopped early; tables collected from the finished runs by `--collect`)."
        ),
        "",
        machine() + ".",
        "",
        "Configurations: *in-process k=0* is today's lockstep path (the trainer's own hf engine); *in-process k>0* has no "
        "`rollout.servers`, so the trainer starts a local `rlvr serve` process itself; *server k* trains against an "
        "`rlvr serve MODEL --engine hf` on 127.0.0.1 this script started. `algo.sampler_correction=auto` (token_truncate "
        "everywhere but in-process k=0). Columns: `collect` is `time/generate` (with k>0 it is mostly waiting for the "
        "batch made ahead); `train (incl. sync)` is `time/train`, which includes the weight sync to the servers; "
        "`weight sync` is `weight_sync/seconds`: sending the weights until the server has staged them (it swaps them in "
        "before its next batch, so the sync never waits for a batch in progress); `waiting for rollouts` is the "
        "collect phase waiting for the batch made ahead.",
        "",
        f"## (a) The demo: bundled tiny model, arithmetic, `rlvr train` defaults, {args.demo_steps} steps, seeds {seeds}",
        "",
        f"32 prompts x 8 completions per step. Held-out: the run's summary.json (500 problems, greedy); before training "
        f"{demo_before:.3f}. Timings pool the steps of every seed.",
        "",
        *tables("Demo", demo, 256),
        *projection("Demo", demo),
    ]
    if smol:
        s, first = SMOL, smol[("in-process", 0)][0]
        b = first["before"]
        lines += [
            f"## (b) SmolLM2-135M-Instruct, {args.smol_steps} steps, seed 0",
            "",
            f"bench/smollm2.py's model (GGUF converted to fp32), prompts, rewards (math + 0.5 x answer tag) and strict "
            f"held-out grading ({first['n']} in-template problems, greedy, {s['max_new_tokens']} new tokens, graded on an "
            f"in-process engine with the trainer's final weights), smaller batches to fit: {s['prompts_per_step']} prompts x "
            f"{s['group_size']} completions, {s['max_new_tokens']} new tokens, lr {s['lr']:g}, temperature {s['temperature']}, "
            f"fp32. Accuracy before training: {b['accuracy']:.3f} [{b['accuracy_ci'][0]:.3f}, {b['accuracy_ci'][1]:.3f}]. "
            f"{args.smol_steps} steps are far too few to learn much: the accuracy row checks that no configuration breaks "
            "training, not which learns best.",
            "",
            *tables("SmolLM2", smol, s["group_size"] * s["prompts_per_step"]),
            *projection("SmolLM2", smol),
        ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
