"""The training forward's log-probs and entropies as the C pass of rlvr.models.native_logprobs against
algo.token_logprobs's torch ops ("torch ops"), in one process: first the op alone, forward and backward (the gradient
written over the logits, as the training forward has it) on logits of several vocabularies, with each way's largest
error against float64; then one training micro-batch per bench/floor.py config (a Trainer, two steps, its first
micro-batch's forward and backward `--reps` times per way, alternating the order) with the largest gradient gap.

    cd bench && python native_logprobs_ab.py V B E J --reps 6 --out results/native_logprobs_amx.md && cd ..
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rlvr.models.native_logprobs as native_logprobs  # noqa: E402
import floor  # noqa: E402
from _floor_step import micro_batch_ab, relative_gap  # noqa: E402
from _report import emit, result_head, table_row  # noqa: E402
from rlvr.algo import token_logprobs  # noqa: E402

OP_SHAPES = [(64, 72, 103), (56, 64, 32000), (32, 64, 49152), (8, 64, 151936)]  # [rows, tokens, V]: B's, V's, SmolLM2's, Qwen2.5's
CASES = [(torch.bfloat16, 1.0, False), (torch.bfloat16, 0.7, True), (torch.float32, 1.0, False)]  # dtype, T, entropy gradient
WAYS = {"torch ops": False, "C pass": True}


def op_once(fn, base, index, w, T, entropy_grad):
    x = base.clone().requires_grad_()
    y = x * 1  # the forward's own output: its gradient written over it
    t0 = time.perf_counter()
    logp, entropy = fn(y, index, temperature=T, with_entropy=True, entropy_grad=entropy_grad, grad_in_logits=True)
    t1 = time.perf_counter()
    (grad,) = torch.autograd.grad((w * logp).sum() + (entropy.sum() if entropy_grad else 0), y)
    return t1 - t0, time.perf_counter() - t1, logp.detach(), entropy.detach(), grad


def op_table(reps: int) -> list[str]:
    lines = [
        "",
        "## The op alone",
        "",
        "| logits [rows, tokens, V] | dtype | T | entropy gradient | torch ops forward / backward ms | C pass forward / backward ms "
        "| C / torch (forward + backward) | largest log-prob error vs float64: torch ops, C pass | largest gradient error vs float64, "
        "over its largest entry: torch ops, C pass | bf16 gradient entries other than float64's rounded: torch ops, C pass |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for N, L, V in OP_SHAPES:
        g = torch.Generator().manual_seed(V)
        for dtype, T, entropy_grad in CASES:
            base = (torch.randn(N, L + 1, V, generator=g) * 3).to(dtype)
            index, w = torch.randint(0, V, (N, L), generator=g), torch.randn(N, L, generator=g)
            x64 = base.double().requires_grad_()
            lp_all = (x64[:, :L] / T).log_softmax(-1)
            logp64 = lp_all.gather(-1, index[..., None]).squeeze(-1)
            loss = (w.double() * logp64).sum() + ((-(lp_all.exp() * lp_all).sum(-1)).sum() if entropy_grad else 0)
            (grad64,) = torch.autograd.grad(loss, x64)
            times, errs, gaps, offs = {}, {}, {}, {}
            for _ in range(reps):
                for name, fn in (("torch", token_logprobs), ("C", native_logprobs.token_logprobs)):
                    f, b, logp, _, grad = op_once(fn, base, index, w, T, entropy_grad)
                    times.setdefault(name, []).append((f, b))
                    errs[name] = float((logp.double() - logp64).abs().max())
                    gaps[name] = float((grad.double() - grad64).abs().max() / grad64.abs().max())
                    offs[name] = int((grad != grad64.to(dtype)).sum()) if dtype == torch.bfloat16 else None
            med = {k: (statistics.median(t[0] for t in v) * 1e3, statistics.median(t[1] for t in v) * 1e3) for k, v in times.items()}
            ratio = sum(med["C"]) / sum(med["torch"])
            lines.append(
                table_row(
                    f"[{N}, {L}, {V}]",
                    str(dtype).removeprefix("torch."),
                    T,
                    entropy_grad,
                    "%.1f / %.1f" % med["torch"],
                    "%.1f / %.1f" % med["C"],
                    f"{ratio:.3f}",
                    f"{errs['torch']:.1e}, {errs['C']:.1e}",
                    f"{gaps['torch']:.1e}, {gaps['C']:.1e}",
                    "-" if offs["C"] is None else f"{offs['torch']}, {offs['C']} of {grad64.numel()}",
                )  # fmt: skip
            )
            print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["V"])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--op-reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--shape", action="append", default=[], help="NAME=JSON, as bench/floor.py's --shape")
    args = ap.parse_args()
    for shape in args.shape:
        floor.add_shape(shape)
    assert native_logprobs.applies(torch.zeros(1, 1, 8)), "the C pass does not apply on this machine (an AVX2 or AVX-512 build)"
    lines = result_head(
        "The training forward's log-probs and entropies: the C pass (rlvr.models.native_logprobs) vs algo.token_logprobs's torch ops",
        f"cd bench && python native_logprobs_ab.py {' '.join(sys.argv[1:])}",
        f"kernel build: {native_logprobs.vector_bits()}-bit vectors; one process; the micro-batch {args.reps} times per way, "
        "alternating which goes first",
        ["config", "precision", *(f"{w} s" for w in WAYS), "C pass / torch ops (medians)", "largest gradient gap"],
    )
    for name in args.configs:
        ways = {w: (lambda on=on: setattr(native_logprobs, "ON", on)) for w, on in WAYS.items()}
        trainer, mb, seconds, grads = micro_batch_ab(name, ways, args.reps)
        native_logprobs.ON = True
        medians = [statistics.median(seconds[w]) for w in WAYS]
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        gap = relative_gap(grads["torch ops"], grads["C pass"])
        rows = mb.rows.stop - mb.rows.start if isinstance(mb.rows, slice) else len(mb.rows)
        lines.append(table_row(f"{name} ({rows} rows)", trainer.precision.name, *runs, f"{medians[1] / medians[0]:.3f}", f"{gap:.1e}"))
        print(lines[-1], flush=True)
    lines += op_table(args.op_reps)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
