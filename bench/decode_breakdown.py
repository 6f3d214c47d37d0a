"""Where the hf engine's decode time goes on CPU, against its compute floor.

    python bench/decode_breakdown.py                 # config B shapes, writes bench/results/decode_cpu.md
    python bench/decode_breakdown.py --model ~/.cache/rlvr/SmolLM2-135M-Instruct --rows 4x16 --tokens 32

Config B of bench/compare_trl.py by default (25M Llama at /tmp/rlvr_bench/llama25m, built by
compare_trl.py; 8 prompts x 8 samples, 64 new tokens, EOS ignored, temperature 1). It times, in one
process and alternating: the lean decode step (rollout/engines/hf/lean_decode.py, the default) and the
transformers-forward decode it replaced (`HFEngine(lean=False)`), then profiles one lean generation
and sorts the time into matmuls, attention, sampling and the rest. Two reference points:
  * floor: 2 x params (without the input embedding) x generated tokens / the 2048^3 matmul peak
    (what compare_trl.py calls the generation floor);
  * decode-shaped matmuls alone: the same per-token products ([rows x hidden] by every layer's
    weights, cycling through all layers as the decode does, so the weights come from memory as
    they do there), with nothing else: what a perfect kernel-for-kernel decode would still pay.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from rlvr.models.precision_choice import cpu_model

HERE = Path(__file__).resolve().parent


def matmul_peak(dtype=torch.float32, n=2048, reps=8) -> float:
    """The best of `reps` n^3 products, GFLOP/s (the best: a peak, not an average over noise)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def decode_shaped_matmuls(model, rows: int, tokens: int) -> float:
    """Seconds for `tokens` steps of only the decode's matmuls: x [rows, in] by each Linear's weight."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(rows, m.in_features) for m in linears}
    with torch.no_grad():
        for _ in range(2):
            for m in linears:
                torch.nn.functional.linear(inputs[m.in_features], m.weight)
        t0 = time.perf_counter()
        for _ in range(tokens):
            for m in linears:
                torch.nn.functional.linear(inputs[m.in_features], m.weight)
    return time.perf_counter() - t0


def categorize(name: str) -> str:
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul"):
        return "matmul"
    if "attention" in name:
        return "attention"
    if name in ("aten::cumsum", "aten::searchsorted", "aten::_log_softmax", "aten::exponential_", "aten::argmax", "aten::uniform_"):
        return "sampling"
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="/tmp/rlvr_bench/llama25m")
    ap.add_argument("--rows", default="8x8", help="prompts x samples per prompt")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "decode_cpu.md"))
    a = ap.parse_args()
    from rlvr.data import render_prompt
    from rlvr.models.loading import load_model, load_tokenizer
    from rlvr.rollout import SamplingParams
    from rlvr.rollout.engines.hf import HFEngine

    torch.set_num_threads(a.threads)
    B, G = (int(x) for x in a.rows.split("x"))
    tok, _ = load_tokenizer(a.model)
    model = load_model(a.model).eval()
    questions = [f"What is {3 * i + 7} + {11 * i + 2}?" for i in range(B)]
    prompts = [render_prompt(q, tok) for q in questions]
    params = SamplingParams(n=G, temperature=1.0, max_new_tokens=a.tokens, ignore_eos=True)
    engines = {"lean step (default)": HFEngine(model, tok), "transformers forward (lean=False)": HFEngine(model, tok, lean=False)}
    times = {k: [] for k in engines}
    for e in engines.values():
        e.generate(prompts, params, list(range(B)))  # warm-up
    for _ in range(a.rounds):
        for name, e in engines.items():
            t0 = time.perf_counter()
            e.generate(prompts, params, list(range(B)))
            times[name].append(time.perf_counter() - t0)

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engines["lean step (default)"].generate(prompts, params, list(range(B)))
    by_kind: dict[str, float] = {}
    for ev in prof.key_averages():
        by_kind[categorize(ev.key)] = by_kind.get(categorize(ev.key), 0.0) + ev.self_cpu_time_total / 1e6
    total_prof = sum(by_kind.values())

    params_no_embed = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    if model.config.tie_word_embeddings:  # the tied matrix is used by the output projection
        params_no_embed += model.get_output_embeddings().weight.numel()
    gen_flops = 2 * params_no_embed * B * G * a.tokens
    peak32, peak16 = matmul_peak(torch.float32), matmul_peak(torch.bfloat16, n=512, reps=2)
    floor = gen_flops / (peak32 * 1e9)
    mm_alone = decode_shaped_matmuls(model, B * G, a.tokens)

    med = {k: statistics.median(v) for k, v in times.items()}
    lines = [
        "# hf engine decode on CPU: time against its floor",
        "",
        f"Command: `python bench/decode_breakdown.py --model {a.model} --rows {a.rows} --tokens {a.tokens}` "
        f"({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_model()}, {a.threads} threads; torch {torch.__version__}. "
        f"Matmul peak fp32 {peak32:.0f} GFLOP/s (2048^3), bf16 {peak16:.1f} GFLOP/s (512^3).  ",
        f"Work: {B} prompts x {G} samples, {a.tokens} new tokens each (EOS ignored), fp32, "
        f"{params_no_embed / 1e6:.2f}M parameters without the input embedding: {gen_flops / 1e9:.0f} GFLOP.",
        "",
        "| decode | median s (all rounds) | x floor |",
        "|---|---|---|",
    ]
    for k, v in times.items():
        lines.append(f"| {k} | {med[k]:.3f} ({', '.join(f'{x:.2f}' for x in v)}) | {med[k] / floor:.2f}x |")
    lines += [
        f"| decode-shaped matmuls alone | {mm_alone:.3f} | {mm_alone / floor:.2f}x |",
        f"| floor (FLOPs / fp32 peak) | {floor:.3f} | 1.00x |",
        "",
        f"Profile of one lean generation ({total_prof:.2f} s of op time under the profiler):",
        "",
        "| ops | s | share |",
        "|---|---|---|",
    ]
    for kind in ("matmul", "attention", "sampling", "other"):
        lines.append(f"| {kind} | {by_kind.get(kind, 0.0):.3f} | {by_kind.get(kind, 0.0) / total_prof:.0%} |")
    lines.append("")
    result = {
        "cpu": cpu_model(),
        "median": med,
        "floor": floor,
        "matmuls_alone": mm_alone,
        "profile": by_kind,
        "peak_fp32": peak32,
        "peak_bf16": peak16,
    }
    print(json.dumps(result, indent=1))
    out = Path(a.out)
    old = out.read_text() if out.exists() else ""
    keep = old[old.index("## Reading") :] if "## Reading" in old else ""
    out.write_text("\n".join(lines) + "\n" + keep)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
