"""torch.exp's slow path on the CPU and algo.exp_flushed, in the sampler and the training log-probs.

torch's CPU exp takes 40-140x as long per element whose result underflows (below fp32's smallest normal number,
about exp(-87.3)) as per element whose result is normal. Shifted logits x - max x get there wherever a row spans
more than 87 nats at the sampling temperature. This times, at vocabulary widths of real models:
  * exp alone: torch.exp against exp_flushed on shifted logits;
  * the sampler (rollout.engines.sampling.sample_tokens, one decode step of 64 rows);
  * the training forward's log-probs and entropy, forward + backward (algo.token_logprobs),
each with torch.exp in exp_flushed's place ("torch.exp", the code before) and as it is, on three kinds of logits:
narrow (N(0, 3): about 25 nats), confident (the same with one token per row 100 above: a sure prediction) and
cold (N(0, 5) at temperature 0.4: 90-100 nats). 2 threads, freed memory kept as rlvr's trainer keeps it
(models.cpu_memory); machine_cache.fastest_times: best of 5 rounds, the ways alternating.

    python bench/exp_underflow.py --out bench/results/exp_underflow_intel.md
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from _report import emit, result_head, table_row  # noqa: E402

from rlvr.algo import exp_flushed, logprobs, token_logprobs  # noqa: E402
from rlvr.models.cpu_memory import keep_freed_memory  # noqa: E402
from rlvr.models.machine_cache import fastest_times  # noqa: E402
from rlvr.rollout.engines import sampling  # noqa: E402

KINDS = {"narrow": 1.0, "confident": 1.0, "cold": 0.4}  # kind: temperature


def _plain_exp(s: torch.Tensor, out: torch.Tensor | None = None, lowest: float | None = None) -> torch.Tensor:
    return torch.exp(s) if out is None else torch.exp(s, out=out)


@contextlib.contextmanager
def _exp(fn):
    """The sampler and the log-probs with `fn` as their exp_flushed inside the block."""
    before = logprobs.exp_flushed, sampling.exp_flushed
    logprobs.exp_flushed = sampling.exp_flushed = fn
    try:
        yield
    finally:
        logprobs.exp_flushed, sampling.exp_flushed = before


def logits_of(kind: str, *shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g) * (5 if kind == "cold" else 3)
    if kind == "confident":
        x[..., 7] += 100.0
    return x


def both(call) -> tuple[float, float]:
    """Seconds per call with torch.exp and with exp_flushed, alternating."""

    def way(fn):
        def run():
            with _exp(fn):
                call()

        return run

    before, after = fastest_times([way(_plain_exp), way(exp_flushed)])
    return before, after


def exp_alone(kind: str, V: int) -> tuple[float, float]:
    x = logits_of(kind, 64, V) / KINDS[kind]
    shifted = x - x.amax(-1, keepdim=True)
    before, after = fastest_times([lambda: torch.exp(shifted), lambda: exp_flushed(shifted)])
    return before, after


def sampler(kind: str, V: int) -> tuple[float, float]:
    logits, u = logits_of(kind, 64, V), torch.rand(64, generator=torch.Generator().manual_seed(1))
    return both(lambda: sampling.sample_tokens(logits, u, temperature=KINDS[kind]))


def training_logprobs(kind: str, N: int, L: int, V: int) -> tuple[float, float]:
    index = torch.randint(0, V, (N, L), generator=torch.Generator().manual_seed(2))
    leaf = logits_of(kind, N, L, V).requires_grad_()

    def forward_backward():
        logp, _ = token_logprobs(leaf, index, temperature=KINDS[kind], with_entropy=True)
        logp.sum().backward()
        leaf.grad = None

    return both(forward_backward)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    keep_freed_memory()
    lines = result_head(
        "torch.exp's underflow slow path: torch.exp against algo.exp_flushed",
        f"python bench/exp_underflow.py {' '.join(sys.argv[1:])}",
        "ms per call, best of 5 rounds, the ways alternating; 2 threads.",
        ["what", "shape", "logits (temperature)", "torch.exp ms", "exp_flushed ms", "ratio"],
    )

    def row(what: str, shape: tuple, kind: str, times: tuple[float, float]) -> None:
        before, after = times
        cells = (what, " x ".join(map(str, shape)), f"{kind} ({KINDS[kind]})", f"{before * 1e3:.2f}", f"{after * 1e3:.2f}")
        lines.append(table_row(*cells, f"{after / before:.2f}"))

    for V in (32000, 49152, 151936):
        for kind in KINDS:
            row("exp of x - max x", (64, V), kind, exp_alone(kind, V))
            row("sample_tokens (a decode step)", (64, V), kind, sampler(kind, V))
    for N, L, V in ((8, 64, 32000), (4, 32, 151936)):
        for kind in KINDS:
            row("token_logprobs forward + backward", (N, L, V), kind, training_logprobs(kind, N, L, V))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
