"""Causal self-attention of long rows for the training forward on the CPU: explicit products in blocks of queries.

SDPA's CPU flash kernel takes the training forward's long causal rows (a prompt's pass in the shared-prefix forward,
whole rows in the plain one), where rlvr.models.attention's explicit products in one piece compute every score of
the square and hold them all. In blocks of query positions a block of queries i0..i1-1 needs only keys 0..i1-1 (the
rest are masked: causal), so close to half the scores are never computed, and blocks of QUERY_ROWS query rows keep
the products large enough to run near their rate:

    for each block of query positions [i0, i1):
        p   = softmax(q[i0:i1] k[:i1]^T x scale + bias[i0:i1, :i1])          [B x Hkv, (i1 - i0) x rep, i1]
        out = p v[:i1]

Forward + backward in fp32, against the flash kernel: 0.8-0.9x its time at bench/floor.py's prompt passes (259
positions), 0.7-0.8x at 512 and 1024 (bench/results/causal_blocks_intel.md). The queries of a kv head's `rep` heads
sit position-major ([B x Hkv, L x rep, D]: row i x rep + j is head j at position i), so a block of positions is a
slice of rows under every kv head at once. The probabilities are kept for the backward (about half the square in
all), which runs the same blocks. The math is explicit_attention's (and so SDPA's): equal in float64 to 1e-10
(tests/models/test_causal_attention.py).
"""

from __future__ import annotations

import torch

from rlvr.models import prefix_attention

# Query rows (positions x rep) per kv head in a block: fewer made the products small enough to lose their rate (256
# rows: F's prompts 1.1x the flash kernel's time), more skip fewer masked scores (bench/results/causal_blocks_intel.md).
QUERY_ROWS = 512


def query_blocks(L: int, rep: int) -> list[tuple[int, int]]:
    """[i0, i1) of each block of L query positions for `rep` query heads per kv head: QUERY_ROWS rows a block."""
    step = max(1, QUERY_ROWS // rep)
    return [(i, min(i + step, L)) for i in range(0, L, step)]


class _CausalBlocks(torch.autograd.Function):
    """softmax(q k^T + bias) v block by block of query positions (module docstring), with the backward written out."""

    @staticmethod
    def forward(ctx, q, k, v, bias, rep: int):
        # q [BH, L x rep, D] (scaled, position-major), k/v [BH, L, D] (BH = B x Hkv), bias [B or 1, 1, L, 1, L] additive
        BH, _, D = q.shape
        L = k.shape[1]
        B = bias.shape[0] if bias.shape[0] > 1 else BH
        blocks = query_blocks(L, rep)
        out = q.new_empty(q.shape)
        probabilities = []
        for i0, i1 in blocks:
            rows = slice(i0 * rep, i1 * rep)
            s = torch.bmm(q[:, rows], k[:, :i1].transpose(1, 2))  # [BH, (i1 - i0) x rep, i1]
            s.view(B, BH // B, i1 - i0, rep, i1).add_(bias[:, :, i0:i1, :, :i1])
            torch.ops.aten._softmax.out(s, -1, False, out=s)  # in place: the scores are not needed again
            torch.bmm(s, v[:, :i1], out=out[:, rows])
            probabilities.append(s)
        ctx.blocks, ctx.rep = blocks, rep
        ctx.save_for_backward(q, k, v, *probabilities)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, *probabilities = ctx.saved_tensors
        rep = ctx.rep
        d_out = d_out.contiguous()
        d_q, d_k, d_v = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for (i0, i1), p in zip(ctx.blocks, probabilities):
            rows = slice(i0 * rep, i1 * rep)
            d_p = torch.bmm(d_out[:, rows], v[:, :i1].transpose(1, 2))
            torch.ops.aten._softmax_backward_data.out(d_p, p, -1, p.dtype, grad_input=d_p)  # p x (d_p - sum(d_p x p)), in place
            torch.bmm(d_p, k[:, :i1], out=d_q[:, rows])
            d_k[:, :i1].baddbmm_(d_p.transpose(1, 2), q[:, rows])
            d_v[:, :i1].baddbmm_(p.transpose(1, 2), d_out[:, rows])
        return d_q, d_k, d_v, None, None


def is_causal(mask: torch.Tensor | None, L: int) -> bool:
    """Whether a mask [.., L, L] (bool: True = attend; or additive) masks every key after its query (None: causal)."""
    if mask is None:
        return True
    later = torch.ones(L, L, dtype=torch.bool, device=mask.device).triu(1)  # key j > query i
    visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
    return not bool((visible & later).any())


def causal_blocked_attention(
    query: torch.Tensor,  # [B, H, L, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    attention_mask: torch.Tensor | None,  # [B or 1, 1, L, L] causal (is_causal): bool (True = attend) or additive; None = causal
    scale: float,
) -> torch.Tensor:
    """softmax(q k^T x scale + mask) v for a causal mask, [B, L, H, D] (transformers' layout), in fp32 (fp64 for fp64
    inputs). A query whose keys are all masked (left padding) averages its visible keys, as explicit_attention's."""
    B, H, L, D = query.shape
    Hkv = key.shape[1]
    rep, dtype = H // Hkv, torch.promote_types(query.dtype, torch.float32)
    # a kv head's queries position-major: [B x Hkv, L x rep, D]
    q = query.to(dtype).view(B, Hkv, rep, L, D).transpose(2, 3).reshape(B * Hkv, L * rep, D) * scale
    k, v = key.to(dtype).reshape(B * Hkv, L, D).contiguous(), value.to(dtype).reshape(B * Hkv, L, D).contiguous()
    if attention_mask is None:
        attention_mask = torch.ones(L, L, dtype=torch.bool, device=query.device).tril()[None, None]
    bias = prefix_attention.additive_bias(attention_mask, dtype)[:, :, :, None, :]  # [B or 1, 1, L, 1, L]
    out = _CausalBlocks.apply(q, k, v, bias, rep)  # [B x Hkv, L x rep, D]
    return out.view(B, Hkv, L, rep, D).permute(0, 2, 1, 3, 4).reshape(B, L, H, D).to(query.dtype)
