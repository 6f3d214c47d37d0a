"""An outside agent's requests on the hf engine: request-level batching (Batcher over engine.generate) against the
continuous decoder (rows join and leave token by token; an episode's next call feeds only its new tokens), the latter
on a decode thread of its own and driven by the main thread (as the trainer runs it).

    python bench/agent_decode.py [--agents 32] [--calls 3] [--repeats 2] [--models tiny-tools,smollm2]

Each agent is a plain `openai`-client loop: a question, then `calls - 1` follow-ups ("Check it again."), each call
sampled at temperature 1 with max_tokens 48. Both schedulers serve the same episodes (same seeds); the arms
alternate, `--repeats` times each. Written to bench/results/agent_decode.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import torch

from rlvr.models import resolve_model_path
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.engines.hf.continuous import ContinuousDecoder
from rlvr.rollout.engines.turns import eos_ids
from rlvr.rollout.sources.agent import AgentEndpoint, engine_sampler

OUT = Path(__file__).parent / "results" / "agent_decode.md"
SMOLLM2 = Path.home() / ".cache" / "rlvr" / "SmolLM2-135M-Instruct"


HTTP = openai.DefaultHttpxClient()  # one for every agent: building one costs ~40 ms of CPU (it loads the CA bundle)


def agent(url: str, key: str, calls: int, question: str) -> None:
    client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, http_client=HTTP)
    messages = [{"role": "user", "content": question}]
    for _ in range(calls):
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=48, temperature=1.0)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Check it again."}]


def one_run(model, tok, arm: str, agents: int, calls: int) -> dict:
    decoder = (
        ContinuousDecoder(model, tok, eos=eos_ids(model, tok), own_thread=arm != "continuous, main thread") if arm != "batcher" else None
    )
    sampler = None if decoder else engine_sampler(HFEngine(model, tok), tok)
    t0 = time.perf_counter()
    with AgentEndpoint(sampler, tok, max_tokens=48, context_length=2048, scheduler=decoder) as ep:
        logs = [ep.open_episode(seed=1000 + i) for i in range(agents)]
        questions = [f"What is {12 + i} * {37 + 2 * i}? Answer with the number." for i in range(agents)]
        with ThreadPoolExecutor(agents) as pool:
            done = [pool.submit(agent, ep.base_url(log.episode), ep.api_key, calls, q) for log, q in zip(logs, questions)]
            ep.batcher.drive(lambda: all(f.done() for f in done))  # the main thread decodes (or waits on a decode thread)
            [f.result() for f in done]
        for log in logs:
            ep.close_episode(log.episode)
    seconds = time.perf_counter() - t0
    snaps = [log.snapshot() for log in logs]
    sampled = sum(len(c.sampled_ids) for s in snaps for c in s)
    prompts = sum(len(c.prompt_ids) for s in snaps for c in s)
    return {
        "seconds": seconds,
        "sampled": sampled,
        "prompt_tokens": prompts,
        "fed": decoder.tokens_fed if decoder else prompts + sampled,  # the Batcher: every call's whole prompt, and more decode steps
        "one_sequence": sum(len(log.sequences()) == 1 for log in logs),
        "ids": [[c.sampled_ids for c in s] for s in snaps],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--models", default="tiny-tools,smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
    lines = [
        "# An outside agent's calls on the hf engine: request batching vs continuous batching",
        "",
        f"Command: `python bench/agent_decode.py {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d %H:%M')}); CPU: {cpu}, "
        f"{args.threads} torch threads, fp32. {args.agents} concurrent `openai`-client agents, {args.calls} calls each (a question, "
        'then "Check it again."), temperature 1, max_tokens 48. Arms alternate; wall time from the first call to the last reply.',
        "",
        "| model | arm | wall s (each run) | sampled tokens | tokens run through the model | episodes as one sequence | sampled tok/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in args.models.split(","):
        path = str(SMOLLM2) if name == "smollm2" else resolve_model_path(name)
        tok = load_tokenizer(path)[0]
        model = load_model(path).eval()
        runs: dict[str, list[dict]] = {"batcher": [], "continuous": [], "continuous, main thread": []}
        for _ in range(args.repeats):
            for arm in runs:
                runs[arm].append(one_run(model, tok, arm, args.agents, args.calls))
                print(name, arm, f"{runs[arm][-1]['seconds']:.1f}s", flush=True)
        same = all(a["ids"] == b["ids"] for a, b in zip(runs["batcher"], runs["continuous"]))
        for arm, rs in runs.items():
            secs = [r["seconds"] for r in rs]
            r, at_least = rs[-1], ">= " if arm == "batcher" else ""
            lines.append(
                f"| {name} | {arm} | {', '.join(f'{s:.1f}' for s in secs)} | {r['sampled']} | {at_least}{r['fed']} | "
                f"{r['one_sequence']}/{args.agents} | {r['sampled'] / statistics.median(secs):.0f} |"
            )
        same = same and all(a["ids"] == b["ids"] for a, b in zip(runs["continuous"], runs["continuous, main thread"]))
        median = {arm: statistics.median(r["seconds"] for r in rs) for arm, rs in runs.items()}
        lines.append(
            f"| {name} | continuous / batcher | {median['batcher'] / median['continuous']:.2f}x faster (median) | "
            f"same sampled ids in every arm: {same} | | | |"
        )
        lines.append(
            f"| {name} | main thread / decode thread | "
            f"{median['continuous'] / median['continuous, main thread']:.2f}x faster (median) | | | | |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
