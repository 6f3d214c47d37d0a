"""The lean decode step's attention on the CPU: write the new token's keys/values, then attend, as one function.

One query per row (GQA: `rep` queries per kv head) against the row's keys/values: a write into the buffers, two
batched products of [rep, D] x [D, S] and a softmax between them. The eager step calls it as it is; the compiled
step (compiled_decode.py) traces it into its layer, where inductor fuses the write, the products of one query
row (reductions, not GEMMs) and the softmax into one loop over each row's keys and values. The write and the
reads take the slot as an argument (select/narrow, not indexing) so that a compiled graph keeps it symbolic.
tests/rollout/test_lean_decode.py checks both layouts against the model's own forward.

On the CPU the eager step reads the buffers whole (`whole`): it grows them a few slots at a time and masks the
slots not yet written, because the batched products over a slice of each row's buffer (slots 0..t of S) ran at half
the rate of the same products over buffers of just those slots (AMD EPYC, fp32, config B's shapes).

The shared layout can run both parts through SDPA's flash kernel instead (`flash`), as the decode did before the
explicit products: on an AMD EPYC the products took 0.4-0.9x the kernel's time (bench/results/attention_cpu.md),
on an Intel Xeon in fp32 the kernel decoded a 9M model's long prompts 9-17 % faster
(bench/results/decode_attention_intel.md). So the eager step asks `shared_flash_pays` once per decode: both ways
timed on this machine at the decode's shapes the first time, the answer kept in decode_attention.json beside the
precision cache (rlvr.models.machine_cache), so later runs there choose the same.
"""

from __future__ import annotations

import torch

from rlvr.models.machine_cache import fastest_times, measured_once, power_of_two_at_least

FLASH_AT_MOST = 0.97  # the kernel runs when it takes at most this share of the explicit products' time
_CHOICES: dict[tuple, bool] = {}  # this process's answers of shared_flash_pays


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
    own_bias: torch.Tensor | None = None,  # whole buffers, shared layout: [1, 1, 1, S] 0 over slots 0..t, -inf after
    whole: bool = False,  # the buffers are read whole, their slots after t masked (by bias, or own_bias when shared)
    *,
    flash: bool = False,  # shared layout: both parts through SDPA's flash kernel (module docstring)
) -> torch.Tensor:
    """softmax(q K^T x scale + bias) V over (the prompt) + (the row's tokens 0..t), [n, Hq x D], in the buffers' dtype.
    Shared layout: the prompt part once per group (its G queries together) and the own part per row, merged exactly
    by their log-sum-exps. Whole buffers (lean_decode.DecodeState.slots): read whole, a masked slot's weight is 0."""
    n, Hkv, D = q.shape[0], own_k.shape[1], own_k.shape[-1]
    own_k.select(2, t).copy_(k)
    own_v.select(2, t).copy_(v)
    keys, values = (own_k, own_v) if whole else (own_k.narrow(2, 0, t + 1), own_v.narrow(2, 0, t + 1))
    qr = q.to(own_k.dtype).view(n, Hkv, -1, D)  # grouped-query: q heads j*rep..(j+1)*rep-1 read kv head j
    rep = qr.shape[2]
    if prefix_k is None:  # repeated layout: prompt and own tokens in one buffer
        out, _ = _attend(qr, keys, values, scale, bias if whole else bias.narrow(-1, 0, t + 1))
        return out.reshape(n, Hkv * rep * D)
    assert prefix_v is not None and rows is not None, "the shared layout passes prefix_v and rows with prefix_k"
    B, G = prefix_k.shape[0], group_size
    own = _flash if flash else _attend_lse
    o_own, lse_own = own(qr, keys, values, scale, own_bias)  # lse [n, Hkv, rep]
    # every row still decoding: rows is 0..n-1 (compaction keeps their order), so the rows are their groups' places as
    # they are; eager only, where it saves four ops a layer; the compiled step keeps one graph whether rows have left or not
    every_row = n == B * G and not torch.compiler.is_compiling()
    # else the rows still decoding into their group's places, the finished ones' zero
    qf = qr if every_row else qr.new_zeros(B * G, Hkv, rep, D).index_copy_(0, rows, qr)
    qf = qf.view(B, G, Hkv, rep, D).transpose(1, 2).reshape(B, Hkv, G * rep, D)  # a group's queries together
    o_p, lse_p = (_flash if flash else _attend_lse)(qf, prefix_k, prefix_v, scale, bias)  # lse [B, Hkv, G x rep]
    o_p = o_p.view(B, Hkv, G, rep, D).transpose(1, 2).reshape(B * G, Hkv, rep, D)
    lse_p = lse_p.view(B, Hkv, G, rep).transpose(1, 2).reshape(B * G, Hkv, rep)
    if not every_row:
        o_p, lse_p = o_p[rows], lse_p[rows]
    # exact merge of the two partial softmaxes: weights exp(lse_p) and exp(lse_own), normalised
    w = torch.sigmoid(lse_p - lse_own)[..., None]
    return torch.lerp(o_own, o_p, w).reshape(n, Hkv * rep * D)


def _weights(q, k, scale: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The scores q k^T x scale + bias [b, h, m, S] and their softmax, for q [b, h, m, D] and k [b, h, S, D]. Every
    query sees at least one key (its own token, or a prompt's last), so no row of scores is all -inf."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # [b, h, m, S]
    if bias is not None:
        s = s + bias
    # softmax normalises after exp(s - max), as the kernel does: exp(s - lse) would carry lse's rounding into every weight
    return s, torch.softmax(s, dim=-1)


def _attend(q, k, v, scale: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T x scale + bias) v [b, h, m, D] and the scores [b, h, m, S], for v [b, h, S, D]. Two batched
    products: on the CPU mostly 0.4-0.9x the time of SDPA's flash kernel for the decode's few queries per kv head
    (bench/results/attention_cpu.md), the same math up to rounding."""
    s, p = _weights(q, k, scale, bias)
    return torch.matmul(p, v), s


def _attend_lse(q, k, v, scale: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """_attend's output and each query's log-sum-exp [b, h, m] (it merges two parts), read off the softmax instead of
    a logsumexp: the softmax's largest weight is exp(max - max) / sum = 1 / sum (its own rounding only), so
    lse = max + log(sum) = max - log(largest weight). Two max-reductions instead of logsumexp's second exp over every
    score: the prompt part of config F's decode attention (64 queries per kv head over ~300 keys) 0.7-0.85x the time
    (AMD EPYC, fp32)."""
    s, p = _weights(q, k, scale, bias)
    return torch.matmul(p, v), s.amax(-1) - p.amax(-1).log()


def _flash(q, k, v, scale: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA's CPU flash kernel: the output [b, h, m, D] and each query's log-sum-exp [b, h, m]."""
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias, scale=scale)
    return out[0], out[1]


def shared_flash_pays(groups: int, group_size: int, q_heads: int, kv_heads: int, head_dim: int, prompt: int, capacity: int, dtype) -> bool:
    """Whether the shared layout's decode attention runs faster through the flash kernel on this machine at these
    shapes (prompt length and new-token capacity rounded up to a power of two): timed once, then read back."""
    P, T = power_of_two_at_least(prompt), power_of_two_at_least(capacity)
    shape: dict[str, int | str] = dict(groups=groups, group_size=group_size, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim)
    # explicit: the explicit products' version (2: the log-sum-exp read off the softmax); an answer timed against
    # an earlier one is timed again
    shape |= dict(prompt=P, capacity=T, dtype=str(dtype).removeprefix("torch."), explicit=2)
    local = (*shape.values(), torch.get_num_threads())
    if local not in _CHOICES:
        timing = lambda: _time_shared(groups, group_size, q_heads, kv_heads, head_dim, P, T, dtype)  # noqa: E731
        _CHOICES[local] = bool(measured_once("decode_attention", shape, timing).get("flash"))
    return _CHOICES[local]


def _time_shared(B: int, G: int, Hq: int, Hkv: int, D: int, P: int, T: int, dtype) -> dict:
    """Seconds per call of decode_attention both ways on random data of these shapes, at slot T // 2 (mid-decode)
    (machine_cache.fastest_times)."""
    n, t = B * G, max(T // 2, 1)
    q, k, v = torch.randn(n, Hq, D, dtype=dtype), torch.randn(n, Hkv, D, dtype=dtype), torch.randn(n, Hkv, D, dtype=dtype)
    own_k, own_v = torch.randn(n, Hkv, T, D, dtype=dtype), torch.randn(n, Hkv, T, D, dtype=dtype)
    pk, pv, bias = torch.randn(B, Hkv, P, D, dtype=dtype), torch.randn(B, Hkv, P, D, dtype=dtype), torch.zeros(B, 1, 1, P, dtype=dtype)
    args = (q, k, v, own_k, own_v, t, bias, D**-0.5, pk, pv, torch.arange(n), G)
    with torch.no_grad(), torch.autocast("cpu", enabled=False):  # as the step calls it
        flash_s, explicit_s = fastest_times([lambda: decode_attention(*args, flash=True), lambda: decode_attention(*args, flash=False)])
    return {"flash": flash_s <= FLASH_AT_MOST * explicit_s, "flash_s": flash_s, "explicit_s": explicit_s}
