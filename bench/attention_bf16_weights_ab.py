"""The training forward's explicit attention under bf16 autocast, its softmax weights kept in fp32 (the code before
5765b16) against bf16 (rlvr.models.attention.explicit_attention now), and SDPA's flash kernel beside:

    python bench/attention_bf16_weights_ab.py

Forward + backward, best of 4 per way, two rounds alternating, 2 threads; inputs as attention_cpu.py builds them
(queries and keys fp32, values bf16, causal with left padding on half the rows). Then each way's error against the
float64 truth (output and the three gradients, max error relative to the largest value) at one smaller shape.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from attention_cpu import best_ms  # noqa: E402

from rlvr.models import prefix_attention  # noqa: E402
from rlvr.models.attention import explicit_attention  # noqa: E402

SHAPES = [(64, 8, 2, 48, 307, 40), (64, 8, 8, 72, 72, 64), (64, 12, 4, 72, 72, 64), (64, 8, 8, 64, 323, 64), (64, 8, 2, 128, 128, 40)]


def fp32_weights(query, key, value, attention_mask, scale):
    """explicit_attention as it was: the softmax writes fp32 weights, which autocast casts for the product with v."""
    B, H, Lq, D = query.shape
    Hkv, Lk = key.shape[1], key.shape[2]
    rep, dtype = H // Hkv, torch.promote_types(query.dtype, torch.float32)
    q = query.to(dtype).reshape(B, Hkv, rep * Lq, D) * scale
    s = torch.matmul(q, key.to(dtype).transpose(-1, -2)).view(B, Hkv, rep, Lq, Lk)
    s = s + prefix_attention.additive_bias(attention_mask, s.dtype)[:, :, None]
    p = torch.softmax(s, dim=-1, dtype=dtype).view(B, Hkv, rep * Lq, Lk)
    out = torch.matmul(p, value.to(dtype)).view(B, H, Lq, D).transpose(1, 2)
    return out.contiguous()


def inputs(B, H, Hkv, Lq, Lk, D):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, L, D, generator=g).requires_grad_() for h, L in ((H, Lq), (Hkv, Lk), (Hkv, Lk)))
    v = v.detach().bfloat16().requires_grad_()
    pad = torch.zeros(B, Lk, dtype=torch.bool)
    pad[: B // 2, : Lk // 4] = True
    causal = torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq)
    last = causal & ~torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq - 1)
    return q, k, v, (causal[None] & ~pad[:, None, :])[:, None] | last


def main() -> None:
    torch.set_num_threads(2)
    ways = {"fp32 weights": fp32_weights, "bf16 weights": explicit_attention}
    print("| B | H / Hkv | Lq x Lk | D | fp32 weights ms | bf16 weights ms | bf16 / fp32 | SDPA ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for B, H, Hkv, Lq, Lk, D in SHAPES:
        q, k, v, mask = inputs(B, H, Hkv, Lq, Lk, D)
        ms: dict[str, float] = {}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for _ in range(2):
                for name, f in ways.items():
                    ms[name] = min(ms.get(name, 1e9), best_ms(lambda: f(q, k, v, mask, D**-0.5), (q, k, v), 4))  # noqa: B023
                sdpa = best_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=H != Hkv), (q, k, v), 4)  # noqa: B023
                ms["SDPA"] = min(ms.get("SDPA", 1e9), sdpa)
        a, b = ms["fp32 weights"], ms["bf16 weights"]
        print(f"| {B} | {H} / {Hkv} | {Lq} x {Lk} | {D} | {a:.1f} | {b:.1f} | {b / a:.2f} | {ms['SDPA']:.1f} |", flush=True)

    q, k, v, mask = inputs(8, 8, 2, 48, 120, 40)
    g = torch.randn(8, 48, 8, 40, generator=torch.Generator().manual_seed(1))

    def run(f, autocast: bool, dtype=None):
        leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in (q, k, v)]
        if dtype is None:
            leaves[2] = v.detach().float().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = f(*leaves, mask, 40**-0.5)
        return [out.double(), *torch.autograd.grad(out.double(), leaves, g.double())]

    truth = run(explicit_attention, False, torch.float64)

    def sdpa(q, k, v, m, s):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True, scale=s).transpose(1, 2)

    print("\nError against the float64 truth (8 rows, 8 / 2 heads, 48 x 120, D 40): output, dq, dk, dv")
    for name, f in (("SDPA", sdpa), *ways.items()):
        got = [t.detach() for t in run(f, True)]
        errors = [float((a - b.detach()).abs().max() / b.detach().abs().max()) for a, b in zip(got, truth)]
        print(f"{name}: " + ", ".join(f"{e:.2e}" for e in errors))


if __name__ == "__main__":
    main()
