"""The shared-prompt decode attention's log-sum-exp two ways (rlvr.rollout.engines.hf.decode_attention.attend_with_lse):

    python bench/decode_lse_ab.py ops F C         # the attention call alone at configs' decode shapes, from bench/
    python bench/decode_lse_ab.py generation F 8  # whole generations of config F in one process, 8 per way

  * logsumexp: torch.logsumexp over the scores after the softmax (the code before 2026-12-04's change);
  * softmax max: max - log(the softmax's largest weight), two max-reductions (the code now).
Both with the explicit products (flash=False). `ops` times decode_attention alone, fp32 as the decode keeps its
cache, at slot T/2, best of 7 runs of 50 calls, the ways alternating; prints each and the ratio. `generation` runs
bench/generation_ab.py (the explicit products forced both ways) and compares the tokens.
"""

from __future__ import annotations

import sys
import time

import torch

import rlvr.rollout.engines.hf.decode_attention as da
import rlvr.rollout.engines.hf.lean_decode as ld

softmax_max = da.attend_with_lse


def with_logsumexp(q, k, v, scale: float, bias=None):
    o, s = da.attend(q, k, v, scale, bias)
    return o, torch.logsumexp(s, dim=-1)


# (groups B, group size G, query heads, kv heads, head size, prompt tokens, new tokens) of bench/floor.py's configs
SHAPES = {"F": (4, 16, 8, 2, 40, 300, 48), "C": (8, 8, 8, 8, 64, 270, 64), "K": (4, 16, 6, 2, 64, 300, 32)}


def ops(names: list[str]) -> None:
    torch.set_num_threads(2)
    for name in names:
        B, G, Hq, Hkv, D, P, T = SHAPES[name]
        n, t = B * G, T // 2
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(n, h, D, generator=g) for h in (Hq, Hkv, Hkv))
        own_k, own_v = torch.randn(n, Hkv, T, D, generator=g), torch.randn(n, Hkv, T, D, generator=g)
        pk, pv, bias = torch.randn(B, Hkv, P, D, generator=g), torch.randn(B, Hkv, P, D, generator=g), torch.zeros(B, 1, 1, P)
        args = (q, k, v, own_k, own_v, t, bias, D**-0.5, pk, pv, torch.arange(n), G)
        best = {"logsumexp": float("inf"), "softmax max": float("inf")}
        outs = {}
        with torch.no_grad():
            for r in range(7):
                for way in list(best) if r % 2 == 0 else list(best)[::-1]:
                    da.attend_with_lse = with_logsumexp if way == "logsumexp" else softmax_max
                    outs[way] = da.decode_attention(*args)
                    start = time.perf_counter()
                    for _ in range(50):
                        da.decode_attention(*args)
                    best[way] = min(best[way], (time.perf_counter() - start) / 50)
        da.attend_with_lse = softmax_max
        diff = float((outs["logsumexp"] - outs["softmax max"]).abs().max())
        print(
            f"{name} {SHAPES[name]}: logsumexp {best['logsumexp'] * 1e6:.0f} us, softmax max {best['softmax max'] * 1e6:.0f} us, "
            f"ratio {best['softmax max'] / best['logsumexp']:.2f}, max |out diff| {diff:.1e}"
        )


def generation(name: str, reps: int) -> None:
    from generation_ab import generation_ab

    ld.decode_attention_way = lambda *a, **kw: da.AttentionWay(a[7], False, kw["shared"] is not False)  # the explicit products both ways
    ways = {
        "logsumexp": lambda: setattr(da, "attend_with_lse", with_logsumexp),
        "softmax max": lambda: setattr(da, "attend_with_lse", softmax_max),
    }
    _, outputs, _ = generation_ab(name, ways, reps)
    a, b = outputs["logsumexp"][0], outputs["softmax max"][0]
    same = (a.completion_ids == b.completion_ids).all(-1)
    print(f"the same tokens in {int(same.sum())} of {same.numel()} rows")


if __name__ == "__main__":
    if sys.argv[1] == "ops":
        ops(sys.argv[2:] or list(SHAPES))
    else:
        generation(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 6)
