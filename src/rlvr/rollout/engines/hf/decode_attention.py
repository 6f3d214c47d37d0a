"""The lean decode step's attention on the CPU: write the new token's keys/values, then attend, as one function.

One query per row (GQA: `rep` queries per kv head) against the row's keys/values: a write into the buffers, two
batched products of [rep, D] x [D, S] and a softmax between them. The eager step calls it as it is; the compiled
step (compiled_decode.py) traces it into its layer, where inductor fuses the write, the products of one query
row (reductions, not GEMMs) and the softmax into one loop over each row's keys and values. The write and the
reads take the slot as an argument (select/narrow, not indexing) so that a compiled graph keeps it symbolic.
tests/rollout/test_lean_decode.py checks both layouts against the model's own forward.
"""

from __future__ import annotations

import torch


def decode_attention(
    q: torch.Tensor,  # [n, Hq, D] the new token's queries (rotated)
    k: torch.Tensor,  # [n, Hkv, D] its keys (rotated), written at slot t
    v: torch.Tensor,  # [n, Hkv, D]
    own_k: torch.Tensor,  # [n, Hkv, S, D] the rows' buffers (repeated layout: prompt in the first slots)
    own_v: torch.Tensor,  # [n, Hkv, S, D]
    t: int,  # the slot this token goes to; slots 0..t are read
    bias: torch.Tensor,  # repeated: [n, 1, 1, S]; shared: [B, 1, 1, P] over the prefix; 0 or -inf
    scale: float,
    prefix_k: torch.Tensor | None = None,  # shared layout: [B, Hkv, P, D], each prompt once
    prefix_v: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,  # shared layout: [n] which of the B x G rows these are
    group_size: int = 1,
) -> torch.Tensor:
    """softmax(q K^T x scale + bias) V over (the prompt) + (the row's tokens 0..t), [n, Hq x D], in the buffers' dtype.
    Shared layout: the prompt part once per group (its G queries together) and the own part per row, merged exactly
    by their log-sum-exps."""
    n, Hkv, D = q.shape[0], own_k.shape[1], own_k.shape[-1]
    own_k.select(2, t).copy_(k)
    own_v.select(2, t).copy_(v)
    keys, values = own_k.narrow(2, 0, t + 1), own_v.narrow(2, 0, t + 1)
    qr = q.to(own_k.dtype).view(n, Hkv, -1, D)  # grouped-query: q heads j*rep..(j+1)*rep-1 read kv head j
    rep = qr.shape[2]
    if prefix_k is None:  # repeated layout: prompt and own tokens in one buffer
        out, _ = _attend(qr, keys, values, scale, bias.narrow(-1, 0, t + 1))
        return out.reshape(n, Hkv * rep * D)
    assert prefix_v is not None and rows is not None, "the shared layout passes prefix_v and rows with prefix_k"
    B, G = prefix_k.shape[0], group_size
    o_own, s_own = _attend(qr, keys, values, scale)
    lse_own = torch.logsumexp(s_own, dim=-1)  # [n, Hkv, rep]
    # the rows still decoding into their group's places, the finished ones' zero (with all rows: a copy; one code path
    # keeps one compiled graph whether rows have left or not)
    qf = qr.new_zeros(B * G, Hkv, rep, D).index_copy_(0, rows, qr)
    qf = qf.view(B, G, Hkv, rep, D).transpose(1, 2).reshape(B, Hkv, G * rep, D)  # a group's queries together
    o_p, s_p = _attend(qf, prefix_k, prefix_v, scale, bias)
    lse_p = torch.logsumexp(s_p, dim=-1)  # [B, Hkv, G x rep]
    o_p = o_p.view(B, Hkv, G, rep, D).transpose(1, 2).reshape(B * G, Hkv, rep, D)[rows]
    lse_p = lse_p.view(B, Hkv, G, rep).transpose(1, 2).reshape(B * G, Hkv, rep)[rows]
    # exact merge of the two partial softmaxes: weights exp(lse_p) and exp(lse_own), normalised
    w = torch.sigmoid(lse_p - lse_own)[..., None]
    return torch.lerp(o_own, o_p, w).reshape(n, Hkv * rep * D)


def _attend(q, k, v, scale: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T x scale + bias) v [b, h, m, D] and the scores [b, h, m, S] (their log-sum-exp merges two parts),
    for q [b, h, m, D] and k, v [b, h, S, D]. Two batched products: on the CPU mostly 0.4-0.9x the time of SDPA's flash kernel
    for the decode's few queries per kv head (bench/results/attention_cpu.md), the same math up to rounding. Every
    query sees at least one key (its own token, or a prompt's last), so no row of scores is all -inf."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # [b, h, m, S]
    if bias is not None:
        s = s + bias
    # softmax normalises after exp(s - max), as the kernel does: exp(s - lse) would carry lse's rounding into every weight
    return torch.matmul(torch.softmax(s, dim=-1), v), s
