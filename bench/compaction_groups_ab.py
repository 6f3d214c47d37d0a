"""The lean decode's shared-layout attention after a compaction in which whole groups finished: the prompt part over
every group (their finished rows' queries zero, as before DecodeState.select dropped finished groups) against over the
groups still decoding only (now). Random data at bench/floor.py's long-prompt shapes, half the groups finished, the
rows left from the other half; decode_attention alone, best of 7 runs of 50 calls, the two ways alternating.

    python bench/compaction_groups_ab.py --out bench/results/compaction_groups_amd.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from _report import result_head
from rlvr.rollout.engines.hf.decode_attention import decode_attention
from rlvr.rollout.engines.hf.lean_decode import DecodeState

# name: (groups B, group size G, query heads, kv heads, head size, prompt tokens, own slots)
SHAPES = {"C": (8, 8, 8, 8, 64, 270, 64), "F": (4, 16, 8, 2, 40, 300, 48)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    lines = result_head(
        "Shared-layout decode attention after whole groups finished: prompt part over every group vs the groups left",
        f"python bench/compaction_groups_ab.py {' '.join(sys.argv[1:])}",
        "best of 7 x 50 calls per way, alternating; half the groups finished, the rows left every row of the other half.",
        ["config shape (B, G, Hq, Hkv, D, P, own)", "every group us", "groups left us", "left / every", "max |diff|"],
    )
    for name, (B, G, Hq, Hkv, D, P, S) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        prefix = [torch.randn(B, Hkv, P, D, generator=g) for _ in range(2)]
        left = torch.arange(B * G).view(B, G)[1::2].reshape(-1)  # every row of the odd groups
        n, t = len(left), S // 2
        own = [torch.randn(n, Hkv, S, D, generator=g) for _ in range(2)]
        q, k, v = torch.randn(n, Hq, D, generator=g), torch.randn(n, Hkv, D, generator=g), torch.randn(n, Hkv, D, generator=g)
        every = DecodeState(own[:1], own[1:], torch.zeros(B, 1, 1, P), left, G, t, prefix[:1], prefix[1:])
        every_row = [torch.zeros(B * G, Hkv, S, D)]
        kept = DecodeState(every_row, every_row, torch.zeros(B, 1, 1, P), torch.arange(B * G), G, t, prefix[:1], prefix[1:])
        kept.select(left)  # drops the finished groups
        kept.own_keys, kept.own_values = own[:1], own[1:]  # the same own buffers as `every`
        ways = {"every": every, "left": kept}
        best, outs = {w: float("inf") for w in ways}, {}
        for r in range(7):
            for w in list(ways) if r % 2 == 0 else list(ways)[::-1]:
                a = ways[w].attention_args(0, D**-0.5)
                outs[w] = decode_attention(q, k, v, *a)
                start = time.perf_counter()
                for _ in range(50):
                    decode_attention(q, k, v, *a)
                best[w] = min(best[w], (time.perf_counter() - start) / 50)
        diff = float((outs["every"] - outs["left"]).abs().max())
        shape = f"{name} ({B}, {G}, {Hq}, {Hkv}, {D}, {P}, {S})"
        times = f"{best['every'] * 1e6:.0f} | {best['left'] * 1e6:.0f} | {best['left'] / best['every']:.2f}"
        lines.append(f"| {shape} | {times} | {diff:.1e} |")
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join([*lines, ""]))


if __name__ == "__main__":
    main()
