"""The decode's sampler for unfiltered rows as the C pass of rlvr.rollout.engines.native_sampler against sampling.py's
torch ops, in one process (bench/generation_ab.py: one Trainer on a bench/floor.py config, one training step, then the
same generation `reps` times per way, alternating), and the sampler alone on [64, V] logits. The kernel's exp is its
own: the table says whether the generations drew the same tokens, and how far apart their log-probs are.

    cd bench && python native_sampler_ab.py V Q --shape 'Q={"llama": {...}, ...}' --reps 6 \
        --out results/native_sampler_amx.md && cd ..
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time

import torch

import floor
import rlvr.rollout.engines.native_sampler as native_sampler
from _report import emit, result_head, table_row
from generation_ab import generation_ab
from rlvr.rollout.engines.sampling import sample_tokens

WAYS = {"torch ops": False, "C pass": True}
OP_SHAPES = [(64, 32000), (64, 49152), (64, 151936)]


def _set(on: bool) -> None:
    native_sampler.ON = on


def op_table(reps: int) -> list[str]:
    lines = [
        "",
        "## The sampler alone",
        "",
        "| logits | dtype | T | torch ops ms | C pass ms | C / torch | same tokens | largest log-prob gap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n, V in OP_SHAPES:
        for dtype, T in ((torch.float32, 1.0), (torch.float32, 0.7), (torch.bfloat16, 1.0)):
            g = torch.Generator().manual_seed(V)
            logits, u = (torch.randn(n, V, generator=g) * 3).to(dtype), torch.rand(n, generator=g)
            times: dict[str, list[float]] = {w: [] for w in WAYS}
            outs = {}
            for _ in range(reps):
                for way, on in WAYS.items():
                    _set(on)
                    x = logits.clone()  # the decode step's own logits, overwritten by the torch path
                    t = time.perf_counter()
                    outs[way] = sample_tokens(x, u, temperature=T, overwrite=True)
                    times[way].append(time.perf_counter() - t)
            med = [statistics.median(times[w]) * 1e3 for w in WAYS]
            (a_tok, a_lp, _), (b_tok, b_lp, _) = outs.values()
            same = bool(torch.equal(a_tok, b_tok))
            gap = float((a_lp - b_lp).abs().max())
            ratio = f"{med[1] / med[0]:.3f}"
            lines.append(
                table_row(f"[{n}, {V}]", str(dtype).removeprefix("torch."), T, f"{med[0]:.2f}", f"{med[1]:.2f}", ratio, same, f"{gap:.1e}")
            )
            print(lines[-1], flush=True)
    _set(True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["V"])
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=JSON", help="a config of your own (bench/floor.py --shape)")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--op-reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    for shape in args.shape:
        floor.add_shape(shape)
    assert native_sampler.vector_bits() >= 256, "the C sampler does not apply on this machine (an AVX2 or AVX-512 build)"
    lines = result_head(
        "The decode's sampler for unfiltered rows: the C pass (rlvr.rollout.engines.native_sampler) vs sampling.py's torch ops",
        f"cd bench && python native_sampler_ab.py {shlex.join(sys.argv[1:])}",
        f"kernel build: {native_sampler.vector_bits()}-bit vectors; one process per config, the same generation {args.reps} times "
        "per way, alternating which goes first",
        ["config", "precision", *(f"{w} s" for w in WAYS), "C pass / torch ops (medians)", "same tokens", "largest log-prob gap"],
    )
    for name in args.configs:
        trainer, outputs, seconds = generation_ab(name, {w: (lambda on=on: _set(on)) for w, on in WAYS.items()}, args.reps)
        a, b = (outputs[w] for w in WAYS)
        same = all(torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(a, b))
        gap = max(float((x.sampling_logprobs - y.sampling_logprobs).abs().max()) for x, y in zip(a, b)) if same else float("nan")
        med = [statistics.median(seconds[w]) for w in WAYS]
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        lines.append(table_row(name, trainer.precision.name, *runs, f"{med[1] / med[0]:.3f}", same, f"{gap:.1e}"))
        print(lines[-1], flush=True)
    _set(True)
    lines += op_table(args.op_reps)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
