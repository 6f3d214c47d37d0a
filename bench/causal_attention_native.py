"""The training forward's fp32 causal attention, forward + backward: the C kernel (rlvr.models.native_causal_attention)
against the ways rlvr.models.attention takes without it.

    python bench/causal_attention_native.py --out bench/results/causal_attention_native_amd.md

For each shape (rows B, query heads H / kv heads Hkv, queries Lq over Lk keys aligned to the last, head size D; a
causal mask with 0-3 left-padded keys per row; or, with a prompt, G rows per group over a shared prompt of P keys
then their own Lq) it times, best of --repeats after a warm-up, the ways in turn: the kernel; explicit_attention (the
explicit products, or grouped_prefix_attention over a shared prompt); SDPA as causal_sdpa runs it (per chunk of
queries where it takes the call, else one call; over the prompt repeated per row). Every input fp32, no autocast, as
an fp32 training forward passes them (queries a transposed view). "best other" is the fastest of the others, which
rlvr took before the kernel by its bounds (EXPLICIT_MAX, causal_sdpa's conditions).
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

from rlvr.models import attention, native_causal_attention as nca, prefix_attention  # noqa: E402

# (B, H, Hkv, Lq, Lk, D, G, P): bench/floor.py's configs' attention in an fp32 training micro-batch, and longer rows.
# G, P > 0: the completions over their group's shared prompt (the shared-prefix forward's tail), Lk = Lq own keys
SHAPES = [
    (64, 4, 2, 256, 256, 64, 8, 8),  # L's completions over their 8-token prompts
    (64, 4, 2, 256, 264, 64, 0, 0),  # the same over the prompt repeated per row
    (64, 8, 2, 48, 48, 40, 16, 259),  # F's completions over their long prompt
    (4, 8, 2, 259, 259, 40, 0, 0),  # F's prompts' own pass
    (64, 8, 8, 64, 64, 64, 8, 12),  # B's completions (a kv head per query head)
    (16, 4, 4, 240, 271, 32, 0, 0),  # H: a turn's rows, a kv head per query head
    (16, 4, 4, 119, 150, 32, 0, 0),
    (64, 4, 4, 201, 201, 32, 0, 0),  # H's micro-batch of whole episodes (bench/causal_attention_native_ab.py)
    (64, 8, 2, 48, 48, 40, 0, 0),  # short rows: the explicit products' ground
    (64, 4, 4, 100, 100, 32, 0, 0),
    (16, 12, 4, 512, 512, 64, 0, 0),  # long rows
    (8, 8, 2, 1024, 1024, 64, 0, 0),
]


def _best(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def ways(B, H, Hkv, Lq, Lk, D, G, P, seed=0):
    """name -> forward + backward of one way, for a shape."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Lq, H, D, generator=g).transpose(1, 2).requires_grad_()
    k, v = (torch.randn(B, Hkv, Lk, D, generator=g).requires_grad_() for _ in range(2))
    d_out = torch.randn(B, Lq, H, D, generator=g)
    scale = D**-0.5
    keys_i, queries = torch.arange(Lk), torch.arange(Lq)
    if G:  # own keys causal from 0, the group's prompt left-padded by 0-3
        U = B // G
        pk, pv = (torch.randn(U, Hkv, P, D, generator=g).requires_grad_() for _ in range(2))
        prompt_mask = torch.arange(P)[None] >= torch.randint(0, 4, (U,), generator=g)[:, None]
        own = (keys_i[None, None] <= queries[None, :, None])[:, None]  # [1, 1, Lq, Lk]

        def native():
            keys = nca.prefix_key_range(prompt_mask, own, B, Lk)
            nca.causal_attention(q, k, v, keys, scale, (pk, pv)).backward(d_out)

        def explicit():
            prefix_attention.grouped_prefix_attention(q, k, v, own, pk, pv, prompt_mask, scale).backward(d_out)

        def sdpa():
            fk, fv, mask = prefix_attention.repeated(k, v, own, pk, pv, prompt_mask, G)
            out = attention.causal_sdpa(q, fk, fv, mask, scale, 0.0, {})
            if out is None:
                out = F.scaled_dot_product_attention(q, fk, fv, mask, scale=scale, enable_gqa=True).transpose(1, 2)
            out.backward(d_out)

    else:
        start = torch.randint(0, 4, (B,), generator=g)
        mask = ((keys_i[None, None] <= queries[None, :, None] + Lk - Lq) & (keys_i >= start[:, None, None]))[:, None]

        def native():
            nca.causal_attention(q, k, v, nca.key_range(mask, B, Lq, Lk), scale).backward(d_out)

        def explicit():
            attention.explicit_attention(q, k, v, mask, scale).backward(d_out)

        def sdpa():
            out = attention.causal_sdpa(q, k, v, mask, scale, 0.0, {})
            if out is None:
                out = F.scaled_dot_product_attention(q, k, v, mask, scale=scale, enable_gqa=True).transpose(1, 2)
            out.backward(d_out)

    return {"kernel": native, "explicit": explicit, "SDPA": sdpa}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "causal_attention_native.md"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if not nca.available():
        raise SystemExit("the kernel did not build here (or its vectors are narrower than 256 bits)")
    lines = [
        "# The training forward's fp32 causal attention: the C kernel against the other ways",
        "",
        f"Command: `python bench/causal_attention_native.py --threads {a.threads} --repeats {a.repeats}` "
        f"({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, {a.threads} threads, torch {torch.__version__}.  ",
        "Forward + backward, ms, best of the repeats after a warm-up. Shape: B rows, H / Hkv heads, Lq queries over Lk keys"
        " (with a prompt: G rows a group over P shared prompt keys, then their own Lq), head size D.",
        "",
        "| B | H / Hkv | Lq x Lk | D | prompt (G, P) | kernel | explicit | SDPA (chunked) | kernel / best other |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for shape in SHAPES:
        B, H, Hkv, Lq, Lk, D, G, P = shape
        ms = {name: 1e3 * _best(fn, a.repeats) for name, fn in ways(*shape).items()}
        other = min(ms["explicit"], ms["SDPA"])
        prompt = f"{G}, {P}" if G else "-"
        row = f"| {B} | {H} / {Hkv} | {Lq} x {Lk} | {D} | {prompt} | {ms['kernel']:.1f} | {ms['explicit']:.1f} | {ms['SDPA']:.1f} |"
        lines.append(row + f" {ms['kernel'] / other:.2f} |")
        print(lines[-1], flush=True)
    Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
