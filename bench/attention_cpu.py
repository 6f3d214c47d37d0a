"""Attention on the CPU, training forward and decode step: SDPA (torch's flash kernel) against rlvr's explicit products.

    python bench/attention_cpu.py                  # writes bench/results/attention_cpu.md
    python bench/attention_cpu.py --threads 1 --out /tmp/a.md

For each shape (rows B, query heads H / kv heads Hkv, query positions Lq, key positions Lk, head size D; a causal
mask with left padding on half the rows) it times forward + backward of `F.scaled_dot_product_attention` (what
transformers' SDPA function runs) and of `rlvr.models.attention.explicit_attention`, best of 5 after a warm-up, both
as a Llama's training forward runs them under bf16 autocast: queries and keys in fp32 (the rotary embedding's
output), values in bf16 (a projection's). The ratio explicit / SDPA below
1 is where the explicit products pay; rlvr.models.attention.EXPLICIT_MAX["bf16"] is set from this table.

The decode table: one query per row over a KV cache of T positions (fp32, as the lean decode step keeps it on the CPU;
a padding bias on half the rows), forward only: `F.scaled_dot_product_attention` against
`rlvr.rollout.engines.hf.decode_attention.attend` (as the repeated layout calls it: no log-sum-exp), best of 5
runs of 20 calls.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from _report import cpu_name  # noqa: E402

from rlvr.models.attention import EXPLICIT_MAX, explicit_attention  # noqa: E402

# (B, H, Hkv, Lq, Lk, D): bench/floor.py's configs' heads (B, E: D 64; F: D 40) at square lengths around the
# crossovers, completions after a long shared prompt (the shared-prefix forward's tail: Lq < Lk), a few prompts'
# own pass (the shared-prefix forward's head) and long rows
SHAPES = [
    (64, 8, 8, 76, 76, 64),
    *[(64, 12, 4, L, L, 64) for L in (48, 72, 96, 128, 160, 192)],
    *[(64, 8, 2, L, L, 40) for L in (72, 96, 128, 160, 192, 256, 300)],
    *[(64, 8, 8, L, L, 64) for L in (128, 192, 256)],
    (64, 12, 4, 48, 300, 64),
    (64, 8, 2, 48, 300, 40),
    (64, 8, 2, 48, 307, 40),
    (64, 8, 8, 32, 291, 64),
    (64, 8, 8, 64, 323, 64),
    (64, 8, 8, 96, 355, 64),
    (16, 8, 8, 64, 600, 64),
    (4, 8, 2, 259, 259, 40),
    (8, 8, 8, 259, 259, 64),
    (16, 8, 2, 512, 512, 40),
    (8, 16, 8, 512, 512, 128),
    (2, 8, 2, 1024, 1024, 40),
    (2, 12, 4, 1024, 1024, 64),
]


def best_ms(fn, inputs, repeats: int) -> float:
    out = fn()
    grad = torch.randn_like(out)
    torch.autograd.grad(out, inputs, grad)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.autograd.grad(fn(), inputs, grad)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def measure(B, H, Hkv, Lq, Lk, D, repeats) -> tuple[float, float]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, L, D, generator=g).requires_grad_() for h, L in ((H, Lq), (Hkv, Lk), (Hkv, Lk)))
    v = v.detach().bfloat16().requires_grad_()
    pad = torch.zeros(B, Lk, dtype=torch.bool)
    pad[: B // 2, : Lk // 4] = True  # left padding on half the rows
    causal = torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq)
    last = torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq) & ~torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq - 1)
    mask = (causal[None] & ~pad[:, None, :])[:, None] | last  # every query sees at least its own key
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sdpa = best_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=H != Hkv), (q, k, v), repeats)
        explicit = best_ms(lambda: explicit_attention(q, k, v, mask, D**-0.5), (q, k, v), repeats)
    return sdpa, explicit


# (rows n, H, Hkv, T, D): the decode's shapes for bench/floor.py's B (8 heads of 64), E (12 / 4 of 64), F (8 / 2 of 40)
DECODE_SHAPES = [(64, H, Hkv, T, D) for T in (20, 76, 140, 300) for H, Hkv, D in ((8, 8, 64), (12, 4, 64), (8, 2, 40))]


def measure_decode(n, H, Hkv, T, D, repeats) -> tuple[float, float]:
    from rlvr.rollout.engines.hf.decode_attention import attend as _attend_explicit

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(n, H, 1, D, generator=g), torch.randn(n, Hkv, T, D, generator=g), torch.randn(n, Hkv, T, D, generator=g)
    bias = torch.zeros(n, 1, 1, T)
    bias[: n // 2, ..., :3] = float("-inf")  # left padding on half the rows
    qr = q.view(n, Hkv, H // Hkv, D)  # the lean step's grouped-query layout

    def best_us(fn):
        fn()
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(20):
                fn()
            best = min(best, (time.perf_counter() - t) / 20)
        return best * 1e6

    sdpa = best_us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=D**-0.5, enable_gqa=H != Hkv))
    explicit = best_us(lambda: _attend_explicit(qr, k, v, D**-0.5, bias))
    return sdpa, explicit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "attention_cpu.md"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    bounds = EXPLICIT_MAX["bf16"]
    lines = [
        "# Attention on the CPU: SDPA against explicit products",
        "",
        f"Command: `python bench/attention_cpu.py --threads {a.threads} --repeats {a.repeats}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, torch {torch.__version__}, {a.threads} threads. "
        f"Forward + backward under bf16 autocast, best of {a.repeats}.  ",
        f"Under bf16 autocast rlvr takes the explicit products where Lq x Lk <= {bounds.scores} "
        f"and B x H x Lq x Lk <= {bounds.elements} (rlvr.models.attention.EXPLICIT_MAX['bf16']).",
        "",
        "## The training forward: forward + backward under bf16 autocast",
        "",
        "| B | H / Hkv | Lq x Lk | D | SDPA ms | explicit ms | explicit / SDPA | rlvr runs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for B, H, Hkv, Lq, Lk, D in SHAPES:
        sdpa, explicit = measure(B, H, Hkv, Lq, Lk, D, a.repeats)
        chosen = "explicit" if Lq * Lk <= bounds.scores and B * H * Lq * Lk <= bounds.elements else "SDPA"
        lines.append(f"| {B} | {H} / {Hkv} | {Lq} x {Lk} | {D} | {sdpa:.1f} | {explicit:.1f} | {explicit / sdpa:.2f} | {chosen} |")
        print(lines[-1], flush=True)
    lines += [
        "",
        "## The decode step: one query per row over the KV cache (fp32, forward)",
        "",
        "| rows | H / Hkv | T | D | SDPA us | explicit us | explicit / SDPA |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n, H, Hkv, T, D in DECODE_SHAPES:
        sdpa, explicit = measure_decode(n, H, Hkv, T, D, a.repeats)
        lines.append(f"| {n} | {H} / {Hkv} | {T} | {D} | {sdpa:.0f} | {explicit:.0f} | {explicit / sdpa:.2f} |")
        print(lines[-1], flush=True)
    Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
