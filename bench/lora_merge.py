"""Generation with LoRA, adapters merged (rlvr.models.lora_merge) against peft's three products, side by side.

    python bench/lora_merge.py --out bench/results/lora_merge.md

The 76M GQA Llama of bench/floor.py's config E/G/I (built under /tmp/rlvr_bench if missing) with LoRA r 16 on every
Linear (B moved off its zero init), 8 prompts x 8 samples x 64 tokens (EOS ignored), in fp32 (the only precision that
merges). One warm-up round, then rounds alternating which version goes first; the hf engine's generate() timed alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "lora_merge.md")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE))
    import compare_trl
    from _report import cpu_name
    from peft import LoraConfig, get_peft_model

    from rlvr.models.loading import load_model, load_tokenizer
    from rlvr.models.precision import autocast_context
    from rlvr.rollout.engines.hf import HFEngine
    from rlvr.rollout.engines.protocols import SamplingParams

    torch.set_num_threads(a.threads)
    path = compare_trl.WORK / "llama76m_gqa"
    compare_trl.build_llama(path, compare_trl.LLAMAS["llama76m_gqa"])
    tok, _ = load_tokenizer(str(path), False)
    model = load_model(str(path), "float32", torch.device("cpu"), False)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.01)
    prompts = [f"What is {i} plus {2 * i}? Answer:" for i in range(8)]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=64, ignore_eos=True)
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(a.rounds + 1):
        for merge in (True, False) if r % 2 else (False, True):
            with torch.no_grad(), autocast_context("none", torch.device("cpu"), model):
                start = time.perf_counter()
                HFEngine(model, tok, merge_lora=merge).generate(prompts, params, list(range(8)))
                elapsed = time.perf_counter() - start
            if r:  # round 0 warms up
                times[merge].append(elapsed)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = [
        f"| {'merged' if m else 'peft (three products)'} | {' '.join(f'{t:.2f}' for t in ts)} | {statistics.median(ts):.2f} |"
        for m, ts in times.items()
    ]
    pairs = [p / m for m, p in zip(times[True], times[False])]
    a.out.write_text(
        "\n".join(
            [
                "# LoRA generation: adapters merged vs peft's path (fp32)",
                "",
                f"Command: `python bench/lora_merge.py --rounds {a.rounds} --threads {a.threads}` ({when}; "
                f"{cpu_name()}, {a.threads} threads; torch {torch.__version__}).",
                "76M GQA Llama (hidden 768, 12 layers), LoRA r 16 on every Linear, 8 prompts x 8 samples x 64 tokens, fp32.",
                "",
                "| version | generate() s per round | median |",
                "|---|---|---|",
                *rows,
                "",
                f"peft / merged per round: {' '.join(f'{x:.2f}' for x in pairs)} (median {statistics.median(pairs):.2f}).",
                "",
            ]
        )
    )
    print(a.out.read_text())


if __name__ == "__main__":
    main()
