"""The multi-turn decode's sampling per step: each row's random number drawn from its generator at each of its samples
(the decode before: one torch.rand(1) per row and step, then a cat) against episode_decode._sample taking it from the
rows' numbers drawn up front (episode_decode._row_uniforms). Both give each row the same numbers (tests/rollout/
test_multi_turn_decode.py); this times one step of every row sampling, 2 threads (machine_cache.fastest_times: best
of 5 rounds, the two ways alternating).

    python bench/episode_sampling.py --out bench/results/episode_sampling_intel.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from _report import emit, result_head, table_row  # noqa: E402

from rlvr.models.machine_cache import fastest_times  # noqa: E402
from rlvr.rollout.engines.hf import episode_decode  # noqa: E402
from rlvr.rollout.engines.protocols import SamplingParams  # noqa: E402
from rlvr.rollout.engines.sampling import sample_tokens  # noqa: E402


def per_step_draws(logits: torch.Tensor, rows: list[int], params: SamplingParams, gens: list[torch.Generator]) -> dict:
    """The decode's sampling before the numbers were drawn up front."""
    uniforms = torch.cat([torch.rand(1, generator=gens[r]) for r in rows])  # [n]
    token, logp, _ = sample_tokens(logits[rows], uniforms, temperature=params.temperature, entropy=False)
    return dict(zip(rows, zip(token.tolist(), logp.tolist())))


def one_shape(rows: int, vocab: int, T: int = 240, G: int = 8) -> tuple[float, float]:
    """us per step (a draw per row and step, drawn up front) with every one of `rows` rows sampling."""
    logits, params = torch.randn(rows, vocab), SamplingParams(n=G, temperature=1.0, max_new_tokens=T)
    gens = [torch.Generator().manual_seed(r) for r in range(rows)]
    uniforms = episode_decode._row_uniforms(list(range(rows // G)), G, T, torch.device("cpu"))
    draws, every = torch.zeros(rows, dtype=torch.long), list(range(rows))
    apart = lambda: per_step_draws(logits, every, params, gens)  # noqa: E731
    up_front = lambda: (draws.zero_(), episode_decode._sample(logits, every, params, uniforms, draws))  # noqa: E731
    before, after = fastest_times([apart, up_front])
    return before * 1e6, after * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    lines = result_head(
        "The multi-turn decode's sampling per step: a draw per row and step vs numbers drawn up front",
        f"python bench/episode_sampling.py {' '.join(sys.argv[1:])}",
        "one step of every row sampling, best of 5 rounds, the ways alternating.",
        ["rows", "vocabulary", "a draw per row and step, us", "drawn up front, us", "ratio"],
    )
    for rows, vocab in ((64, 103), (64, 49152), (16, 103), (256, 103)):
        before, after = one_shape(rows, vocab)
        lines.append(table_row(rows, vocab, f"{before:.0f}", f"{after:.0f}", f"{after / before:.2f}"))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
