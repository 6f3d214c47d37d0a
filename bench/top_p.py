"""The top-p nucleus of a decode step's 64 rows: one sort of every row (the sampler before) against
rollout.engines.sampling.outside_nucleus (the nucleus looked for among each row's 64, then 1024 most probable tokens,
topk, then a sort of the rows left).

Rows: zipf (logits -2a log(1 + rank) + N(0, 0.3), a = 1 and 0.5: a language model's long tail, nuclei of a few to a
few hundred tokens), flat (N(0, 3): nuclei of thousands, the worst case) and confident (N(0, 3) with one token 100
above). 2 threads, freed memory kept as the trainer keeps it; machine_cache.fastest_times (best of 5 rounds, the
ways alternating). Also says whether both ways give the same mask (they may differ where a total sits within fp32's
rounding of top_p: the sort's softmax sums the row in another order).

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
from rlvr.rollout.engines.sampling import outside_nucleus  # noqa: E402


def by_sort(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The sampler's top-p mask before: a sort of every row."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    p = sorted_logits.softmax(-1)
    return torch.zeros_like(p, dtype=torch.bool).scatter(-1, order, p.cumsum(-1) - p >= top_p)


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
    """A table row: the nucleus sizes, both ways' ms and whether their masks are the same."""
    logits = rows_of(kind, V)
    drop = outside_nucleus(logits, top_p)
    size = (~drop).sum(-1).float()
    same = torch.equal(drop, by_sort(logits, top_p))
    before, after = fastest_times([lambda: by_sort(logits, top_p), lambda: outside_nucleus(logits, top_p)])
    sizes = f"{size.median():.0f}, {size.max():.0f}"
    return [V, kind, top_p, sizes, f"{before * 1e3:.1f}", f"{after * 1e3:.1f}", f"{after / before:.2f}", same]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    keep_freed_memory()
    lines = result_head(
        "The top-p nucleus of a decode step: one sort of every row against candidates (topk)",
        f"python bench/top_p.py {' '.join(sys.argv[1:])}",
        "64 rows, ms per call, best of 5 rounds, the ways alternating; 2 threads.",
        ["vocabulary", "rows", "top_p", "nucleus tokens (median, max)", "sort ms", "candidates ms", "ratio", "same mask"],
    )
    for V in (32000, 49152, 151936):
        for kind in ("zipf 1", "zipf 0.5", "flat", "confident"):
            for top_p in (0.9, 0.95):
                *cells, same = one(V, kind, top_p)
                lines.append(table_row(*cells, "yes" if same else "no"))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
