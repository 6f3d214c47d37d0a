"""The training forward's log-probs and entropy over the vocabulary, forward + backward, 2 threads: the plain ops as
the eager forward ran them before (logits / T, selective_log_softmax and token_entropy in chunks of 16 rows) against
algo.token_logprobs (one autograd node, its own chunks), alternating, on bf16 logits as bf16 autocast makes them:

    python bench/logprobs_vocab.py --out bench/results/logprobs_vocab_amd.md

Shapes [rows, tokens, V]: config B's vocabulary (103), V's (32000), SmolLM2's (49152) and Qwen2.5's (151936). Each
timed pass computes the log-probs and entropies, weights them by random per-token coefficients as the loss does,
and runs the backward to the logits. Differences: the largest |fused - plain| of the log-probs, the entropies and
the logits' gradient; the entropies' largest error against fp64, and how many of the gradient's bf16 elements differ
from the fp64 gradient rounded to bf16.
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

from rlvr.algo import selective_log_softmax, token_entropy, token_logprobs  # noqa: E402

SHAPES = [(64, 72, 103), (56, 64, 32000), (32, 64, 49152), (16, 64, 151936)]


def plain(logits, index, temperature):
    """The eager forward before algo.token_logprobs (rlvr.models.forward at da4f506)."""
    if temperature != 1.0:
        logits = logits / temperature
    return selective_log_softmax(logits, index, 16), token_entropy(logits, 16)


def fused(logits, index, temperature):
    logp, entropy = token_logprobs(logits, index, temperature=temperature, with_entropy=True)
    assert entropy is not None
    return logp, entropy


def one_pass(way, base, index, weights, temperature):
    x = base.detach().requires_grad_()
    t = time.perf_counter()
    logp, entropy = way(x, index, temperature)
    (weights * logp).sum().backward()
    return time.perf_counter() - t, logp.detach(), entropy, x.grad


def truth(base, index, weights, temperature):
    x = base.detach().double().requires_grad_()
    logp_all = (x / temperature).log_softmax(-1)
    (weights.double() * logp_all.gather(-1, index[..., None]).squeeze(-1)).sum().backward()
    return logp_all.gather(-1, index[..., None]).squeeze(-1).detach(), -(logp_all.exp() * logp_all).sum(-1).detach(), x.grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    lines = result_head(
        "The training forward's log-probs and entropy over the vocabulary: plain ops vs algo.token_logprobs",
        "python bench/logprobs_vocab.py" + "".join(f" {a}" for a in sys.argv[1:]),
        f"bf16 logits, temperature {args.temperature}; forward + backward, ways alternating, {args.reps} repetitions"
        " (one warm-up each).",
        ["logits [rows, tokens, V]", "plain s per rep", "fused s per rep", "median plain / fused", "logp diff", "entropy diff",
         "grad diff", "entropy err vs fp64 plain / fused", "grad elements off fp64's bf16 plain / fused"],
    )  # fmt: skip
    for N, L, V in SHAPES:
        torch.manual_seed(0)
        base = (torch.randn(N, L, V) * 3).to(torch.bfloat16)
        index = torch.randint(0, V, (N, L))
        weights = torch.randn(N, L)
        for way in (plain, fused):
            one_pass(way, base, index, weights, args.temperature)  # warm-up
        times: dict = {plain: [], fused: []}
        outs: dict = {}
        for _ in range(args.reps):
            for way in (plain, fused):
                dt, *out = one_pass(way, base, index, weights, args.temperature)
                times[way].append(dt)
                outs[way] = out
        t_logp, t_entropy, t_grad = truth(base.float(), index, weights, args.temperature)

        def diff(a, b):
            return (a.double() - b.double()).abs().max().item()

        def off(grad, exact):
            return int((grad != exact.to(grad.dtype)).sum())

        (p_logp, p_ent, p_grad), (f_logp, f_ent, f_grad) = outs[plain], outs[fused]
        ratio = statistics.median(times[plain]) / statistics.median(times[fused])
        lines.append(
            f"| [{N}, {L}, {V}] | {', '.join(f'{t:.3f}' for t in times[plain])} | {', '.join(f'{t:.3f}' for t in times[fused])}"
            f" | {ratio:.2f}x | {diff(p_logp, f_logp):.1e} | {diff(p_ent, f_ent):.1e} | {diff(p_grad, f_grad):.1e}"
            f" | {diff(p_ent, t_entropy):.1e} / {diff(f_ent, t_entropy):.1e} | {off(p_grad, t_grad)} / {off(f_grad, t_grad)} |"
        )
        print(lines[-1], flush=True)
        del base, outs
    lines.append("")
    text = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
