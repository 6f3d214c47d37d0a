"""Do tool calls overlap the multi-turn decode? One batch of episodes with tools that take time
against the same batch with instant tools, same seeds: the tokens are the same, so the difference
in wall time is what the tools cost the decode.

    python bench/multiturn_overlap.py                  # prints the tables
    python bench/multiturn_overlap.py --write bench/results/multiturn_overlap.md

The batch: the bundled tiny-tools model playing guess_number (it calls `guess` about 4.5 times per
episode, on its own, with no forcing), `--prompts` targets x `--group` episodes, temperature 1,
through rlvr.rollout.MultiTurnSource and the rlvr.tools.ToolRunner a run uses (default
concurrency). The slow tool is the environment's own `guess` after a `time.sleep`: `--delay`
seconds for every call (`fixed`), or uniform in [0, 2 x delay] and seeded by (episode, call)
(`varied`). Modes run interleaved, `--repeats` times each.

Also printed, to see the overlap: what the same delays would cost a decode that stopped for them
(every call in turn; or one round per turn, each as long as its slowest call), the waits of the
episode that waits longest (no decode finishes that episode sooner), and how long the decode sat
blocked with nothing to run.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import sys
import threading
import time

import torch

from rlvr.tasks import guess_number as gn
from rlvr.tasks.guess_number import GuessNumber
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.models.precision_choice import cpu_model
from rlvr.rollout import SamplingParams
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.sources.multi_turn import MultiTurnSource, make_format
from rlvr.tools import EnvironmentFactory, ToolRunner


class Calls:
    """What the tools did in one batch: how many ran at once, and each call's delay by (episode, call)."""

    def __init__(self):
        self.lock, self.running, self.peak = threading.Lock(), 0, 0
        self.episodes = itertools.count()  # environments are reset in episode order
        self.delays: dict[tuple[int, int], float] = {}

    def run(self, episode: int, k: int, delay: float) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.delays[episode, k] = delay
        time.sleep(delay)
        with self.lock:
            self.running -= 1

    def stopped_decode(self) -> dict[str, float]:
        """What the calls' delays would cost a decode that stopped for them: every call in turn;
        one round per turn, each round as long as its slowest call; and the waits of the episode
        that waits longest (no decode can finish that episode sooner)."""
        rounds, per_episode = {}, {}
        for (e, k), d in self.delays.items():
            rounds[k] = max(rounds.get(k, 0.0), d)
            per_episode[e] = per_episode.get(e, 0.0) + d
        return {"serial": sum(self.delays.values()), "rounds": sum(rounds.values()), "longest": max(per_episode.values(), default=0.0)}


DELAYS = {  # mode -> the delay of call k of episode e, given --delay
    "instant": lambda e, k, delay: 0.0,
    "fixed": lambda e, k, delay: delay,
    "varied": lambda e, k, delay: random.Random(f"{e}:{k}").uniform(0.0, 2 * delay),
}


def slow_game(mode: str, delay: float, calls: Calls) -> type:
    """GuessNumber whose `guess` first sleeps (same replies, same schema)."""

    class SlowGuessNumber(GuessNumber):
        def reset(self, **row):
            self.episode, self.made = next(calls.episodes), 0
            return super().reset(**row)

        def guess(self, number: int) -> str:
            k, self.made = self.made, self.made + 1
            calls.run(self.episode, k, DELAYS[mode](self.episode, k, delay))
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


def one_batch(model, tok, mode: str, args) -> dict:
    calls = Calls()
    env = EnvironmentFactory(slow_game(mode, args.delay, calls))
    fmt = make_format(
        "tags", tok, tool_names=env.names, schemas=env.schemas, tags={}, result_tags=("<result>", "</result>"), describe=False
    )  # tiny-tools learnt the tags without a description
    engine = TimedEngine(HFEngine(model, tok))
    with ToolRunner(timeout_s=30) as runner:
        source = MultiTurnSource(
            engine,
            tok,
            SamplingParams(n=args.group, temperature=1.0, max_new_tokens=args.max_new_tokens),
            fmt=fmt,
            environment=env,
            runner=runner,
            max_turns=args.max_turns,
        )
        rows = [gn.train_row(i, seed=args.seed) for i in range(args.prompts)]
        t0, c0 = time.perf_counter(), time.thread_time()
        episodes = source.rollout(rows, [args.seed * 1000 + i for i in range(args.prompts)])
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        workers = getattr(runner, "max_workers", "32 (fixed)")  # the runner before the pool was sized to the batch had none
    return {
        "wall": wall,
        "cpu": cpu,
        "blocked": engine.blocked_s,
        "steps": engine.iterations,
        "episodes": episodes,
        "peak": calls.peak,
        "workers": workers,
        "delays": calls.delays,
        **calls.stopped_decode(),
    }


def same_tokens(a, b) -> tuple[bool, float]:
    same = torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.loss_mask, b.loss_mask) and a.completions == b.completions
    return same, float((a.sampling_logprobs - b.sampling_logprobs).abs().max())


def timing_table(runs: dict, label: dict) -> list[str]:
    """Medians per mode; each slow mode's difference from the instant one (median, and between bests)."""
    for r in (r for v in runs.values() for r in v):
        r["own_core"] = r["cpu"] + r["blocked"]  # the wall the decode would take with a core to itself
    keys = ("wall", "own_core", "cpu", "blocked", "steps")
    med = {k: {m: statistics.median(r[m] for r in v) for m in keys} for k, v in runs.items()}
    best = {k: {m: min(r[m] for r in v) for m in keys} for k, v in runs.items()}

    def cell(mode: str, m: str) -> str:
        if mode == "instant":
            return f"{med[mode][m]:.2f}"
        return f"{med[mode][m]:.2f} (**{med[mode][m] - med['instant'][m]:+.2f}**; best {best[mode][m] - best['instant'][m]:+.2f})"

    lines = [
        "| tools | wall, s (slow - instant) | decode CPU + blocked, s (slow - instant) | decode thread CPU, s "
        "| decode blocked on tools, s | decode loop iterations |",
        "|---|---|---|---|---|---|",
    ]
    for mode in runs:
        lines.append(
            f"| {label[mode]} | {cell(mode, 'wall')} | {cell(mode, 'own_core')} | {med[mode]['cpu']:.2f} "
            f"| {med[mode]['blocked']:.2f} | {med[mode]['steps']:.0f} |"
        )
    return lines


def bounds_table(runs: dict, label: dict) -> list[str]:
    """What the slow modes' delays would cost a decode that stopped for them, and the critical path:
    no decode ends episode e before its tokens (one per step, at the mode's mean step time) plus its waits."""
    lengths = runs["instant"][0]["episodes"].attention_mask.sum(-1).tolist()
    lines = [
        "| tools | a decode stopping for every call in turn, s | a decode stopping for each round of calls "
        "(as long as its slowest call), s | the waits of the episode that waits longest, s "
        "| critical path: max over episodes of its tokens x the mean step + its waits, s |",
        "|---|---|---|---|---|",
    ]
    for mode in (m for m in runs if m != "instant"):
        r, step = runs[mode][0], statistics.median(x["cpu"] / x["steps"] for x in runs[mode])
        waits = {}
        for (e, _), d in r["delays"].items():
            waits[e] = waits.get(e, 0.0) + d
        path = max(n * step + waits.get(e, 0.0) for e, n in enumerate(lengths))
        lines.append(
            f"| {label[mode]} | {r['serial']:.2f} | {r['rounds']:.2f} | {r['longest']:.2f} | {path:.2f} (step {1000 * step:.1f} ms) |"
        )
    return lines


def facts(runs: dict, args) -> list[str]:
    ref = runs["instant"][0]["episodes"]
    checks = [same_tokens(ref, r["episodes"]) for v in runs.values() for r in v]
    calls, most, n = int(ref.info["tool_calls"].sum()), int(ref.info["tool_calls"].max()), len(ref)
    return [
        f"batch: {args.prompts} prompts x G={args.group} = {n} episodes of guess_number ({args.model}, temperature 1, "
        f"max_new_tokens={args.max_new_tokens}, max_turns={args.max_turns}); {calls} tool calls ({calls / n:.2f} per episode, "
        f"at most {most}), {int(ref.attention_mask.sum())} tokens after the prompts",
        f"most tool calls running at once: {max(r['peak'] for v in runs.values() for r in v)} "
        f"(the runner's cap on threads: {runs['fixed'][0]['workers']})",
        "same tokens, loss masks and conversations in every run: "
        + ("yes" if all(s for s, _ in checks) else "NO")
        + f"; largest log-prob difference {max(d for _, d in checks):.1e}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-tools", help="a model that plays guess_number in the tag format")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--delay", type=float, default=0.2, help="seconds each slow tool call sleeps (fixed; the mean when varied)")
    ap.add_argument("--max-new-tokens", type=int, default=240)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each mode, interleaved; medians and bests reported")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", help="write the markdown result here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok, _ = load_tokenizer(args.model)
    model = load_model(args.model).eval()

    one_batch(model, tok, "instant", args)  # warm-up: threads, allocator, first forwards
    runs = {mode: [] for mode in DELAYS}
    for _ in range(args.repeats):
        for mode in DELAYS:
            runs[mode].append(one_batch(model, tok, mode, args))
    label = {"instant": "instant", "fixed": f"{args.delay} s each", "varied": f"0-{2 * args.delay:g} s (uniform, seeded per call)"}
    text = "\n".join(timing_table(runs, label) + [""] + bounds_table(runs, label) + [""] + [f"- {f}" for f in facts(runs, args)])
    print(text)
    if args.write:
        command = "nice -n 19 python bench/multiturn_overlap.py " + " ".join(sys.argv[1:])
        load = os.getloadavg()
        header = (
            f"# Multi-turn episodes: do slow tools hold back the decode?\n\n"
            f"Command: `{command}` (torch threads: {args.threads}; `OMP_NUM_THREADS=1`)  \n"
            f"CPU: {cpu_model()}, {os.cpu_count()} cpus; load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n\n"
        )
        with open(args.write, "w") as f:
            f.write(header + text + "\n")


if __name__ == "__main__":
    main()
