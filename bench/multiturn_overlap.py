"""Do tool calls overlap the multi-turn decode? One batch of episodes with tools that take `--delay`
seconds against the same batch with instant tools, same seeds: the tokens are the same, so the
difference in wall time is what the tools cost the decode.

    python bench/multiturn_overlap.py                  # prints the table
    python bench/multiturn_overlap.py --write bench/results/multiturn_overlap.md

The batch: the bundled tiny-tools model playing guess_number (it calls `guess` about 4.5 times per
episode, on its own, with no forcing), `--prompts` targets x `--group` episodes, temperature 1,
through rlvr.rollout.MultiTurnSource and the rlvr.tools.ToolRunner a run uses (default
concurrency). The slow tool is the environment's own `guess` after a `time.sleep(delay)`.

Also printed, to see the overlap: what the tools would cost a decode that stopped for them - every
call in turn (`calls x delay`), or one round per turn with all of a round's calls at once (the
most calls any episode made x delay) - and how long the decode actually sat waiting with nothing
to run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

import torch

from rlvr.data import guess_number as gn
from rlvr.envs.guess_number import GuessNumber
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.rollout import SamplingParams
from rlvr.rollout.hf import HFEngine
from rlvr.rollout.multi_turn import MultiTurnSource, make_format
from rlvr.tools import EnvironmentFactory, ToolRunner


class Calls:
    """How many guesses run at once (the runner's concurrency at work)."""

    def __init__(self):
        self.lock, self.running, self.peak = threading.Lock(), 0, 0

    def __enter__(self):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)

    def __exit__(self, *exc):
        with self.lock:
            self.running -= 1


def slow_game(delay: float, calls: Calls) -> type:
    """GuessNumber whose `guess` first sleeps `delay` seconds (same replies, same schema)."""

    class SlowGuessNumber(GuessNumber):
        def guess(self, number: int) -> str:
            with calls:
                time.sleep(delay)
                return super().guess(number)

    SlowGuessNumber.guess.__doc__ = GuessNumber.guess.__doc__
    return SlowGuessNumber


class TimedEngine:
    """The engine, handing the decode a driver that times how long it blocked waiting for tools."""

    def __init__(self, engine):
        self.engine, self.blocked_s, self.iterations = engine, 0.0, 0

    def sync_weights(self):
        self.engine.sync_weights()

    def generate_episodes(self, prompts, params, seeds, driver):
        outer = self

        class Timed:
            stop_strings = driver.stop_strings
            end_turn = staticmethod(driver.end_turn)

            @staticmethod
            def ready(block):  # once per iteration of the decode loop
                outer.iterations += 1
                t0 = time.perf_counter()
                out = driver.ready(block)
                if block:
                    outer.blocked_s += time.perf_counter() - t0
                return out

        return self.engine.generate_episodes(prompts, params, seeds, Timed())


def one_batch(model, tok, delay: float, args) -> dict:
    calls = Calls()
    env = EnvironmentFactory(slow_game(delay, calls))
    fmt = make_format("tags", tok, tool_names=env.names, schemas=env.schemas, tags={}, result_tags=("<result>", "</result>"))
    engine = TimedEngine(HFEngine(model, tok))
    with ToolRunner(timeout_s=30) as runner:
        source = MultiTurnSource(engine, tok, SamplingParams(n=args.group, temperature=1.0, max_new_tokens=args.max_new_tokens),
                                 fmt=fmt, environment=env, runner=runner, max_turns=args.max_turns)
        rows = [gn.train_row(i, seed=args.seed) for i in range(args.prompts)]
        t0, c0 = time.perf_counter(), time.thread_time()
        episodes = source.rollout(rows, [args.seed * 1000 + i for i in range(args.prompts)])
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        workers = runner.max_workers
    return {"wall": wall, "cpu": cpu, "blocked": engine.blocked_s, "steps": engine.iterations, "episodes": episodes,
            "peak": calls.peak, "workers": workers}


def same_tokens(a, b) -> tuple[bool, float]:
    same = torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.loss_mask, b.loss_mask) \
        and a.completions == b.completions
    return same, float((a.sampling_logprobs - b.sampling_logprobs).abs().max())


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-tools")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--delay", type=float, default=0.2, help="seconds each slow tool call sleeps")
    ap.add_argument("--max-new-tokens", type=int, default=240)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3, help="instant/slow pairs, interleaved; medians reported")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", help="write the markdown result here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok, _ = load_tokenizer(args.model)
    model = load_model(args.model).eval()

    one_batch(model, tok, 0.0, args)  # warm-up: threads, allocator, first forwards
    runs = {"instant": [], "slow": []}
    for _ in range(args.repeats):
        runs["instant"].append(one_batch(model, tok, 0.0, args))
        runs["slow"].append(one_batch(model, tok, args.delay, args))
    ref = runs["instant"][0]["episodes"]
    checks = [same_tokens(ref, r["episodes"]) for kind in runs for r in runs[kind]]
    info = ref.info
    calls, most = int(info["tool_calls"].sum()), int(info["tool_calls"].max())
    tokens = int(ref.attention_mask.sum())
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("wall", "cpu", "blocked", "steps")} for k, v in runs.items()}
    inst, slow = med["instant"], med["slow"]
    walls = {k: ", ".join(f"{r['wall']:.2f}" for r in v) for k, v in runs.items()}
    lines = [
        f"| medians of {args.repeats} runs | instant tools | {args.delay} s tools | slow - instant |",
        "|---|---|---|---|",
        f"| wall, s (each run: {walls['instant']} / {walls['slow']}) | {inst['wall']:.2f} | {slow['wall']:.2f} "
        f"| **{slow['wall'] - inst['wall']:+.2f}** |",
        f"| decode thread CPU time, s | {inst['cpu']:.2f} | {slow['cpu']:.2f} | {slow['cpu'] - inst['cpu']:+.2f} |",
        f"| decode blocked, nothing to run, waiting on tools, s | {inst['blocked']:.2f} | {slow['blocked']:.2f} "
        f"| {slow['blocked'] - inst['blocked']:+.2f} |",
        f"| decode loop iterations | {inst['steps']:.0f} | {slow['steps']:.0f} | {slow['steps'] - inst['steps']:+.0f} |",
        "",
        "| what the slow tools would cost a decode that stops for them | s |",
        "|---|---|",
        f"| every call in turn: {calls} calls x {args.delay} s | {calls * args.delay:.2f} |",
        f"| one round per turn, a round's calls at once: {most} rounds (most calls in an episode) x {args.delay} s | {most * args.delay:.2f} |",
    ]
    n = args.prompts * args.group
    facts = [
        f"batch: {args.prompts} prompts x G={args.group} = {n} episodes of guess_number ({args.model}, temperature 1, "
        f"max_new_tokens={args.max_new_tokens}, max_turns={args.max_turns}); {calls} tool calls ({calls / n:.2f} per episode, "
        f"at most {most}), {tokens} tokens after the prompts",
        f"most tool calls running at once (slow run): {max(r['peak'] for r in runs['slow'])} "
        f"(the runner's cap on threads: {runs['slow'][0]['workers']})",
        "same tokens, loss masks and conversations in every run: " + ("yes" if all(s for s, _ in checks) else "NO")
        + f"; largest log-prob difference {max(d for _, d in checks):.1e}",
    ]
    text = "\n".join(lines + [""] + [f"- {f}" for f in facts])
    print(text)
    if args.write:
        command = "nice -n 19 python bench/multiturn_overlap.py " + " ".join(sys.argv[1:])
        load = os.getloadavg()
        header = (f"# Multi-turn episodes: do slow tools hold back the decode?\n\n"
                  f"Command: `{command}` (torch threads: {args.threads}; `OMP_NUM_THREADS=1`)  \n"
                  f"CPU: {cpu_model()}, {os.cpu_count()} cpus; load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n\n")
        with open(args.write, "w") as f:
            f.write(header + text + "\n")


if __name__ == "__main__":
    main()
