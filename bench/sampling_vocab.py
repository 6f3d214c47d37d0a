"""The hf engines' sampler over the vocabulary, per decode step, 2 threads: the sampler as it was (log_softmax, exp, a
float64 cumsum over [n, V], the entropy's products: rlvr.rollout.engines.sampling at da4f506, reproduced below as
`plain`) against sample_tokens now (exp once, inverse_cdf in two levels), alternating:

    python bench/sampling_vocab.py --out bench/results/sampling_vocab_amd.md

Rows [n, V] fp32 logits (randn x 3), temperature 0.8, no top-k/top-p: config B's vocabulary (103), V's (32000),
SmolLM2's (49152) and Qwen2.5's (151936) at 64 rows, and 32000 at 8. Columns: ms per call of each (median of the
repetitions, each the mean of 20 calls), whether every drawn token is the same, and the largest differences of the
log-probs and entropies.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from _report import result_head  # noqa: E402

from rlvr.rollout.engines.sampling import sample_tokens  # noqa: E402

SHAPES = [(64, 103), (64, 32000), (64, 49152), (64, 151936), (8, 32000)]


def plain(logits: torch.Tensor, uniforms: torch.Tensor, temperature: float):
    """sample_tokens before: log_softmax, exp, a float64 cumsum over [n, V], searchsorted, the entropy's products."""
    logp_all = (logits / temperature).log_softmax(-1)
    p = logp_all.exp()
    cdf = p.double().cumsum(-1)
    token = torch.searchsorted(cdf, (uniforms.double() * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return token, logp_all.gather(-1, token[:, None]).squeeze(-1), -(p * logp_all).nansum(-1)


def fused(logits: torch.Tensor, uniforms: torch.Tensor, temperature: float):
    return sample_tokens(logits, uniforms, temperature=temperature)


def per_call(way, logits, uniforms, temperature, calls: int = 20) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        way(logits, uniforms, temperature)
    return (time.perf_counter() - t) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    temperature = 0.8
    lines = result_head(
        "The hf engines' sampler over the vocabulary: as it was vs sample_tokens now",
        "python bench/sampling_vocab.py" + "".join(f" {a}" for a in sys.argv[1:]),
        f"fp32 logits, temperature {temperature}; ways alternating, {args.reps} repetitions of 20 calls (one warm-up call each).",
        ["logits [n, V]", "before ms per call", "now ms per call", "before / now", "same tokens", "logp diff", "entropy diff"],
    )
    for n, V in SHAPES:
        torch.manual_seed(0)
        logits, uniforms = torch.randn(n, V) * 3, torch.rand(n)
        a, b = plain(logits, uniforms, temperature), fused(logits, uniforms, temperature)
        times: dict = {plain: [], fused: []}
        for _ in range(args.reps):
            for way in (plain, fused):
                times[way].append(per_call(way, logits, uniforms, temperature))
        before, now = statistics.median(times[plain]), statistics.median(times[fused])
        lines.append(
            f"| [{n}, {V}] | {before * 1e3:.2f} | {now * 1e3:.2f} | {before / now:.2f}x | {bool(torch.equal(a[0], b[0]))}"
            f" | {(a[1] - b[1]).abs().max():.1e} | {(a[2] - b[2]).abs().max():.1e} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join([*lines, ""])
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
