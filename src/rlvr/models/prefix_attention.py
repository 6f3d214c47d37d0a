"""Attention of a group's completions over their one shared prompt, without a copy of the prompt per row.

The shared-prefix training forward (rlvr.models.forward) runs each distinct prompt once and then the group's G
completions on top. Handing the completions the prompt's keys and values repeated G times costs, per layer, a copy of
the repeated keys and values, each row's own small products over the same prompt keys, and in the backward a gradient
for every copy that is then summed back over the group. On bench/floor.py's config C (25M Llama, 8 prompts x 8,
~260-token prompts, 64 completion tokens; Intel Xeon, fp32) a training micro-batch takes 4-6 % less time than over the
repeated prompt, on F and K (smaller models, 4 x 16) 0-2 % less (bench/results/prefix_attention_intel.md).

Here a group's completion queries meet the prompt once, as one product per kv head:

    scores = [ q_group k_prompt^T | q_row k_row^T ] x scale + mask      [U, Hkv, G, rep x C, P + C]
    out    = softmax(scores)[.., :P] v_prompt + softmax(scores)[.., P:] v_row

where q_group stacks the G rows' queries ([U, Hkv, G x rep x C, D]) and k_prompt is the prompt's keys once
([U, Hkv, P, D]); the softmax runs over the whole row of P + C scores, so this is softmax(q k^T x scale + mask) v over
the repeated keys, the same math as rlvr.models.attention.explicit_attention, and the gradients reach the prompt's
keys and values summed over the group by the product itself. The products run in blocks of kv heads and rows whose
scores fit the cores' caches (BLOCK_BYTES), forward and backward alike.

The prefix reaches the attention function through `shared_prefix` (a context the forward opens around the
completions' pass): the model runs that pass without a cache, its attention function finds the layer's prompt keys
and values by the module's layer_idx, and `repeated` rebuilds the plain [N, Hkv, P + C, D] keys and mask for the
calls where the explicit products do not pay (no gradient, too many scores, autocast): those then run as before.
The decode's counterpart (rlvr.rollout.engines.hf.shared_prefix) merges two softmaxes by their log-sum-exp for one new
token per row; here one softmax over the concatenated scores keeps the backward to aten's softmax backward.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, NamedTuple

import torch


class SharedPrefix(NamedTuple):
    keys: list[torch.Tensor]  # per layer [U, Hkv, P, D] the prompt's keys, one row per group
    values: list[torch.Tensor]  # per layer [U, Hkv, P, D]
    mask: torch.Tensor  # [U, P] bool, True = a prompt token (False: left padding)
    group_size: int  # G consecutive rows per prompt: the completions' batch is N = U x G


_ACTIVE: contextvars.ContextVar[tuple[SharedPrefix, set[int]] | None] = contextvars.ContextVar("rlvr_shared_prefix", default=None)


@contextlib.contextmanager
def shared_prefix(prefix: SharedPrefix) -> Iterator[set[int]]:
    """Inside the block the attention function of layer i attends over prefix.keys[i] / values[i] as well as its
    own keys. Yields the set of layer indices that took their prefix: a model whose attention of some layer did not
    go through rlvr's function (a custom architecture) leaves a layer out, and its outputs must not be used."""
    taken: set[int] = set()
    token = _ACTIVE.set((prefix, taken))
    try:
        yield taken
    finally:
        _ACTIVE.reset(token)


def take(module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None:
    """(prompt keys, prompt values, prompt mask, G) for this attention module's layer inside `shared_prefix`, else
    None."""
    active = _ACTIVE.get()
    layer = getattr(module, "layer_idx", None)
    if active is None or layer is None:
        return None
    prefix, taken = active
    taken.add(layer)
    return prefix.keys[layer], prefix.values[layer], prefix.mask, prefix.group_size


def additive_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A mask as the bias added to scores: bool (True = attend) -> 0 or dtype's lowest, additive -> itself in dtype,
    clamped at the lowest. Not -inf: a query with every key masked averages them instead of NaN."""
    lowest = torch.finfo(dtype).min
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, lowest)
    return mask.to(dtype).clamp(min=lowest)


def _completion_mask(attention_mask: torch.Tensor | None, C: int, device) -> torch.Tensor:
    """The completions' own mask as [N or 1, 1, C, C] (None: causal)."""
    if attention_mask is None:
        return torch.ones(C, C, dtype=torch.bool, device=device).tril()[None, None]
    return attention_mask


def repeated(key, value, attention_mask, prefix_keys, prefix_values, prefix_mask, G: int):
    """The plain inputs: keys and values [N, Hkv, P + C, D] with the prompt's repeated for each row, and the mask
    [N, 1, C, P + C] (bool, or additive where the completions' mask is)."""
    N, C = key.shape[0], key.shape[2]
    P = prefix_keys.shape[2]
    key = torch.cat([prefix_keys.repeat_interleave(G, 0), key], dim=2)
    value = torch.cat([prefix_values.repeat_interleave(G, 0), value], dim=2)
    own = _completion_mask(attention_mask, C, key.device).expand(N, 1, C, C)
    prompt = prefix_mask.bool().repeat_interleave(G, 0)[:, None, None, :].expand(N, 1, C, P)
    if own.dtype != torch.bool:  # additive
        prompt = additive_bias(prompt, own.dtype)
    return key, value, torch.cat([prompt, own], dim=-1)


# Scores per block of the products below: a block's scores then stay in the cores' caches from the product that writes
# them through the softmax to the products that read them (2 MiB of L2 per core on the Intel Xeon measured). One block
# per layer wrote each layer's scores out to memory and read them back at every step, in the forward and backward; on
# bench/floor.py's config F (4 prompts x 16, 259-token prompts, 48 completion tokens) its products then ran at 35-60 %
# of their rate alone (bench/results/prefix_blocks_intel.md has the measurement).
BLOCK_BYTES = 2 * 2**20


def _blocks(UH: int, G: int, R: int, L: int, itemsize: int) -> list[tuple[slice, slice]]:
    """(kv-head rows, group rows) of each block of [UH, G, R, L] scores: runs of whole kv-head rows where one row holds
    no more than BLOCK_BYTES, else one kv-head row at a time in runs of group rows. Either way a block of q, the scores
    and the outputs is contiguous, so the products below take plain views of it."""
    per_row = R * L * itemsize  # one group row's scores under one kv head
    if G * per_row <= BLOCK_BYTES:
        step = max(1, BLOCK_BYTES // (G * per_row))
        return [(slice(b, min(b + step, UH)), slice(0, G)) for b in range(0, UH, step)]
    step = max(1, BLOCK_BYTES // per_row)
    return [(slice(b, b + 1), slice(g, min(g + step, G))) for b in range(UH) for g in range(0, G, step)]


def _bias_block(bias: torch.Tensor, b: slice, g: slice, kv_heads: int) -> torch.Tensor:
    """The rows of a bias [U or 1, G or 1, ...] (one per prompt, not per kv head) for block (b, g) of kv-head rows."""
    first, last = b.start // kv_heads, (b.stop - 1) // kv_heads  # the block's prompts
    if bias.shape[0] > 1:  # a view where the block's rows are one prompt's heads, else a gather
        bias = bias[first : last + 1] if first == last else bias[torch.arange(b.start, b.stop, device=bias.device) // kv_heads]
    return bias[:, g] if bias.shape[1] > 1 else bias


class _GroupedSoftmaxProducts(torch.autograd.Function):
    """softmax([q k_prompt^T + bias_prompt | q k_own^T + bias_own]) [v_prompt; v_own] with the backward written out,
    block by block (_blocks): the scores of both parts live in one buffer that the products write into (no
    concatenation, no zero-filled gradient per part, as autograd's cat and slices would cost), aten's softmax and its
    backward run in place (each row is read before it is written), and the backward's score gradients take one
    block's buffer, not a layer's."""

    @staticmethod
    def forward(ctx, q, prefix_k, prefix_v, own_k, own_v, prefix_bias, own_bias, kv_heads: int):
        # q [UH, G, R, D] (scaled; UH = U x Hkv rows of a prompt's kv head, R = rep x C query rows per kv head and
        # row), prefix_k/v [UH, P, D], own_k/v [UH, G, C, D]; biases per prompt: prefix [U, 1, 1, P] or None, own
        # [U or 1, G or 1, 1, C, C]
        UH, G, R, D = q.shape
        P, C = prefix_k.shape[1], own_k.shape[2]
        p = q.new_empty(UH, G, R, P + C)  # the scores, then (in place) their softmax: kept for the backward
        out = q.new_empty(UH, G, R, D)
        for b, g in _blocks(UH, G, R, P + C, q.element_size()):
            s, q_b, out_b = p[b, g], q[b, g], out[b, g]  # [bu, bg, R, P + C], [bu, bg, R, D] x 2
            bu, bg = q_b.shape[:2]
            per_head, per_row = s.view(bu, bg * R, P + C), s.view(bu * bg, R, P + C)  # the prompt's part, the row's
            torch.bmm(q_b.view(bu, bg * R, D), prefix_k[b].transpose(1, 2), out=per_head[..., :P])
            torch.bmm(q_b.view(bu * bg, R, D), own_k[b, g].view(bu * bg, C, D).transpose(1, 2), out=per_row[..., P:])
            if prefix_bias is not None:
                s[..., :P] += _bias_block(prefix_bias, b, slice(None), kv_heads)
            s[..., P:].view(bu, bg, R // C, C, C).add_(_bias_block(own_bias, b, g, kv_heads))
            torch.ops.aten._softmax.out(s, -1, False, out=s)  # in place: the scores are not needed again
            torch.bmm(per_head[..., :P], prefix_v[b], out=out_b.view(bu, bg * R, D))
            out_b.view(bu * bg, R, D).baddbmm_(per_row[..., P:], own_v[b, g].view(bu * bg, C, D))
        ctx.save_for_backward(q, prefix_k, prefix_v, own_k, own_v, p)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, prefix_k, prefix_v, own_k, own_v, p = ctx.saved_tensors
        UH, G, R, D = q.shape
        P, C = prefix_k.shape[1], own_k.shape[2]
        d_out = d_out.contiguous()
        d_q, d_own_k, d_own_v = torch.empty_like(q), torch.empty_like(own_k), torch.empty_like(own_v)
        d_prefix_k, d_prefix_v = torch.empty_like(prefix_k), torch.empty_like(prefix_v)  # summed over the group's rows
        blocks = _blocks(UH, G, R, P + C, q.element_size())
        scratch = q.new_empty(max((b.stop - b.start) * (g.stop - g.start) for b, g in blocks) * R * (P + C))
        for b, g in blocks:
            p_b, q_b, d_out_b = p[b, g], q[b, g], d_out[b, g]
            bu, bg = q_b.shape[:2]
            d_p = scratch[: bu * bg * R * (P + C)].view(bu, bg, R, P + C)
            # per kv head over the prompt ([bu, bg x R, .]) and per row over its own tokens ([bu x bg, R, .])
            q_h, q_r, d_out_h, d_out_r = (
                q_b.view(bu, bg * R, D),
                q_b.view(bu * bg, R, D),
                d_out_b.view(bu, bg * R, D),
                d_out_b.view(bu * bg, R, D),
            )
            p_h, p_r = p_b.view(bu, bg * R, P + C)[..., :P], p_b.view(bu * bg, R, P + C)[..., P:]
            d_p_h, d_p_r = d_p.view(bu, bg * R, P + C)[..., :P], d_p.view(bu * bg, R, P + C)[..., P:]
            own_k_r, own_v_r = own_k[b, g].view(bu * bg, C, D), own_v[b, g].view(bu * bg, C, D)
            torch.bmm(d_out_h, prefix_v[b].transpose(1, 2), out=d_p_h)
            torch.bmm(d_out_r, own_v_r.transpose(1, 2), out=d_p_r)
            torch.ops.aten._softmax_backward_data.out(d_p, p_b, -1, p.dtype, grad_input=d_p)  # p x (d_p - sum(d_p x p)), in place
            torch.bmm(d_p_h, prefix_k[b], out=d_q[b, g].view(bu, bg * R, D))
            d_q[b, g].view(bu * bg, R, D).baddbmm_(d_p_r, own_k_r)
            first = g.start == 0  # a kv-head row's first block writes its prompt's gradients, the others add to them
            for d_prefix, x, y in ((d_prefix_k, d_p_h, q_h), (d_prefix_v, p_h, d_out_h)):
                torch.bmm(x.transpose(1, 2), y, out=d_prefix[b]) if first else d_prefix[b].baddbmm_(x.transpose(1, 2), y)
            torch.bmm(d_p_r.transpose(1, 2), q_r, out=d_own_k[b, g].view(bu * bg, C, D))
            torch.bmm(p_r.transpose(1, 2), d_out_r, out=d_own_v[b, g].view(bu * bg, C, D))
        return d_q, d_prefix_k, d_prefix_v, d_own_k, d_own_v, None, None, None


def grouped_prefix_attention(
    query: torch.Tensor,  # [N, H, C, D] the completions' queries, N = U x G
    key: torch.Tensor,  # [N, Hkv, C, D] the completions' own keys
    value: torch.Tensor,  # [N, Hkv, C, D]
    attention_mask: torch.Tensor | None,  # [N or 1, 1, C, C] over the completions' own keys: bool or additive; None = causal
    prefix_keys: torch.Tensor,  # [U, Hkv, P, D]
    prefix_values: torch.Tensor,  # [U, Hkv, P, D]
    prefix_mask: torch.Tensor,  # [U, P] True = a prompt token
    scale: float,
) -> torch.Tensor:
    """softmax(q k^T x scale + mask) v over [prompt | own] keys (module docstring), [N, C, H, D] (transformers'
    layout), in fp32 (fp64 for fp64 inputs). Not under autocast: the attention function keeps the repeated keys there."""
    N, H, C, D = query.shape
    U, Hkv, P, _ = prefix_keys.shape
    G, rep = N // U, H // Hkv
    dtype = torch.promote_types(query.dtype, torch.float32)
    # a kv head's queries of a group's rows together: [U x Hkv, G, rep x C, D]
    q = query.to(dtype).view(U, G, Hkv, rep, C, D).transpose(1, 2).reshape(U * Hkv, G, rep * C, D).contiguous() * scale
    own_k = key.to(dtype).view(U, G, Hkv, C, D).transpose(1, 2).reshape(U * Hkv, G, C, D).contiguous()  # [U x Hkv, G, C, D]
    own_v = value.to(dtype).view(U, G, Hkv, C, D).transpose(1, 2).reshape(U * Hkv, G, C, D).contiguous()
    own_bias = additive_bias(_completion_mask(attention_mask, C, query.device), dtype)
    B = own_bias.shape[0]  # N or 1
    own_bias = own_bias.view(B // G if B > 1 else 1, G if B > 1 else 1, 1, C, C)  # [U or 1, G or 1, 1, C, C]
    prefix_bias = None if bool(prefix_mask.all()) else additive_bias(prefix_mask.bool(), dtype)[:, None, None, :]  # [U, 1, 1, P]
    prefix_k = prefix_keys.to(dtype).reshape(U * Hkv, P, D).contiguous()  # [U x Hkv, P, D]
    prefix_v = prefix_values.to(dtype).reshape(U * Hkv, P, D).contiguous()
    out = _GroupedSoftmaxProducts.apply(q, prefix_k, prefix_v, own_k, own_v, prefix_bias, own_bias, Hkv)  # [U x Hkv, G, rep x C, D]
    return out.view(U, Hkv, G, rep, C, D).permute(0, 2, 4, 1, 3, 5).reshape(N, C, H, D).to(query.dtype)
