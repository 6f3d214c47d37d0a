"""The hf engine's generation with its lean decode step eager and compiled (rollout.compile=on), in one process.

    python bench/decode_compile.py MODEL PROMPTS.jsonl B G T [bf16|fp32] [--reps 5]

B prompts x G completions, T new tokens each (EOS ignored), 2 threads. The two versions alternate within each
rep, on the same prompts and seeds; the first rep of the compiled one includes compiling (reported apart, from its
CompileClock); medians over the other reps. Prints one markdown row per version. Models as bench/floor.py's
(compare_trl.py writes them under /tmp/rlvr_bench).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.rollout.engines.hf.compiled_decode import CompiledLayers
from rlvr.rollout.engines.hf.engine import HFEngine
from rlvr.rollout.engines.protocols import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompts")
    ap.add_argument("B", type=int)
    ap.add_argument("G", type=int)
    ap.add_argument("T", type=int)
    ap.add_argument("dtype", nargs="?", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa")
    tok = AutoTokenizer.from_pretrained(a.model)
    rows = [json.loads(line) for line in open(a.prompts)][: a.B]
    prompts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    P = max(len(tok(p)["input_ids"]) for p in prompts)
    engine = HFEngine(model, tok)
    params = SamplingParams(n=a.G, max_new_tokens=a.T, temperature=1.0, ignore_eos=True)
    versions: dict[str, CompiledLayers | None] = {"eager": None, "compiled": CompiledLayers()}
    times: dict[str, list[float]] = {v: [] for v in versions}
    for _ in range(a.reps):
        for name, compiled in versions.items():
            engine.compiled = compiled
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
                engine.generate(prompts, params, list(range(a.B)))
            times[name].append(time.perf_counter() - t0)
    clock = versions["compiled"].clock  # type: ignore[union-attr]
    eager = statistics.median(times["eager"][1:])
    compiled_s = statistics.median(times["compiled"][1:])
    print(f"<!-- {platform.processor() or platform.machine()}, torch {torch.__version__}, 2 threads -->")
    repaid = f"{clock.seconds / (eager - compiled_s):.0f}" if eager > compiled_s else "never"
    print(
        f"| {a.model.rsplit('/', 1)[-1]} | {a.dtype} | {a.B} x {a.G}, {P}-token prompts, {a.T} new | {eager:.3f} | {compiled_s:.3f} "
        f"| {eager / compiled_s:.2f}x | {clock.seconds:.1f} s, {clock.graphs} graph(s) | {repaid} |"
    )


if __name__ == "__main__":
    main()
