"""The top-p nucleus of a decode step's 64 rows: one sort of every row (the sampler at first), the nucleus looked for
among each row's 64, then 1024 most probable tokens (topk) then a sort of the rows left (`by_candidates`, the sampler
until 2026-12-06, reproduced below), and rollout.engines.sampling.outside_nucleus now (the 64 heaviest tokens from the
blocks with the largest maxima, then bins of x - max x for the rows left).

Rows: zipf (logits -2a log(1 + rank) + N(0, 0.3), a = 1 and 0.5: a language model's long tail, nuclei of a few to a
few hundred tokens), flat (N(0, 3): nuclei of thousands, the worst case) and confident (N(0, 3) with one token 100
above). 2 threads, freed memory kept as the trainer keeps it; machine_cache.fastest_times (best of 5 rounds, the
ways alternating). Also says whether the candidates' and now's masks are the sort's (they may differ where a total sits
within fp32's rounding of top_p: the sort's softmax sums the row in another order), and by how many tokens now's
differs from the sort's at most in a row.

A second table: the top-k mask (the logits below each row's k-th largest) by one topk of every row (before) against
rollout.engines.sampling.outside_top_k (the k largest from the k blocks with the largest maxima), flat rows.

    python bench/top_p.py --out bench/results/top_p_intel.md
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

from rlvr.models.cpu_memory import keep_freed_memory  # noqa: E402
from rlvr.models.machine_cache import fastest_times  # noqa: E402
from rlvr.rollout.engines.sampling import outside_nucleus, outside_top_k  # noqa: E402


def by_sort(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The sampler's top-p mask before: a sort of every row."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    p = sorted_logits.softmax(-1)
    return torch.zeros_like(p, dtype=torch.bool).scatter(-1, order, p.cumsum(-1) - p >= top_p)


def by_candidates(logits: torch.Tensor, top_p: float, candidates: tuple[int, ...] = (64, 1024)) -> torch.Tensor:
    """The sampler's top-p mask until 2026-12-06: among each row's 64, then 1024 most probable tokens, then a sort."""
    n, V = logits.shape
    probs = logits.softmax(-1)
    drop = torch.ones_like(probs, dtype=torch.bool)
    rows = torch.arange(n)
    for K in [k for k in candidates if 4 * k < V] + [V]:
        p = probs if len(rows) == n else probs[rows]
        top, order = p.topk(K, dim=-1) if K < V else p.sort(dim=-1, descending=True)
        out = top.cumsum(-1) - top >= top_p
        found = out[:, -1] if K < V else torch.ones_like(rows, dtype=torch.bool)
        outside = torch.ones(int(found.sum()), V, dtype=torch.bool)
        drop[rows[found]] = outside.scatter_(-1, order[found], out[found])
        rows = rows[~found]
        if len(rows) == 0:
            break
    return drop


def rows_of(kind: str, V: int, n: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if kind.startswith("zipf"):
        a = float(kind.split()[1])
        ranks = torch.stack([torch.randperm(V, generator=g) for _ in range(n)]).float()
        return -2 * a * torch.log1p(ranks) + 0.3 * torch.randn(n, V, generator=g)
    x = torch.randn(n, V, generator=g) * 3
    if kind == "confident":
        x[:, 7] += 100.0
    return x


def one(V: int, kind: str, top_p: float) -> list:
    """A table row: the nucleus sizes, the three ways' ms, whether the masks are the sort's."""
    logits = rows_of(kind, V)
    drop = outside_nucleus(logits, top_p)
    size = (~drop).sum(-1).float()
    sorted_drop = by_sort(logits, top_p)
    same_candidates = torch.equal(by_candidates(logits, top_p), sorted_drop)
    gap = int((drop != sorted_drop).sum(-1).max())
    ways = [lambda: by_sort(logits, top_p), lambda: by_candidates(logits, top_p), lambda: outside_nucleus(logits, top_p)]
    sort_s, candidates_s, now_s = fastest_times(ways)
    sizes = f"{size.median():.0f}, {size.max():.0f}"
    times = [f"{t * 1e3:.1f}" for t in (sort_s, candidates_s, now_s)]
    return [V, kind, top_p, sizes, *times, f"{now_s / candidates_s:.2f}", "yes" if same_candidates else "no", gap]


def top_k_row(V: int, k: int) -> list:
    """A row of the top-k table: topk's and the heaviest blocks' ms, whether their masks are the same."""
    logits = rows_of("flat", V)
    by_topk = lambda: logits < torch.topk(logits, k, dim=-1).values[:, -1:]  # noqa: E731
    same = torch.equal(outside_top_k(logits, k), by_topk())
    before, after = fastest_times([by_topk, lambda: outside_top_k(logits, k)])
    return [V, k, f"{before * 1e3:.2f}", f"{after * 1e3:.2f}", f"{after / before:.2f}", "yes" if same else "no"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    keep_freed_memory()
    lines = result_head(
        "The top-p nucleus of a decode step: a sort of every row, topk candidates then a sort, heaviest blocks then bins",
        f"python bench/top_p.py {' '.join(sys.argv[1:])}",
        "64 rows, ms per call, best of 5 rounds, the ways alternating; 2 threads.",
        [
            "vocabulary",
            "rows",
            "top_p",
            "nucleus tokens (median, max)",
            "sort ms",
            "candidates ms",
            "now ms",
            "now / candidates",
            "candidates: the sort's mask",
            "now: most tokens off the sort's in a row",
        ],
    )
    for V in (32000, 49152, 151936):
        for kind in ("zipf 1", "zipf 0.5", "flat", "confident"):
            for top_p in (0.9, 0.95):
                lines.append(table_row(*one(V, kind, top_p)))
    lines += ["", "| vocabulary | k | topk ms | heaviest blocks ms | ratio | same mask |", "| --- | --- | --- | --- | --- | --- |"]
    for V in (32000, 49152, 151936):
        for k in (20, 50):
            lines.append(table_row(*top_k_row(V, k)))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
