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
keys and values summed over the group by the product itself.

The prefix reaches the attention function through `shared_prefix` (a context the forward opens around the
completions' pass): the model runs that pass without a cache, its attention function finds the layer's prompt keys
and values by the module's layer_idx, and `repeated` rebuilds the plain [N, Hkv, P + C, D] keys and mask for the
calls where the explicit products do not pay (no gradient, too many scores, autocast other than bf16): those then run as
before. Under bf16 autocast the products run in bf16 as explicit_attention runs them there (rlvr.models.attention).
The decode's counterpart (rlvr.rollout.engines.hf.shared_prefix) merges two softmaxes by their log-sum-exp for one new
token per row; here one softmax runs over the concatenated scores. Where the C kernel builds (native_softmax_pair, fp32
or bf16) the two parts stay two dense buffers and the kernel's softmax (and backward) reads both, adding the own keys'
mask and skipping a group's left padding on its way; elsewhere one buffer of P + C scores per row and aten's softmax.
On config F's micro-batch (bf16, ~260-token prompts) the dense buffers took the attention's forward + backward from
21.5 to 13.6 ms a layer: bf16 products over slices rows P + C apart ran 2-2.5x slower (softmax_pair_amx.md).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, NamedTuple

import torch

from rlvr.models import native_softmax_pair


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


class _Scores(NamedTuple):
    """A layer's scores (or their gradient) as the products read and write them."""

    prompt: torch.Tensor  # [U x Hkv, G x R, P] over the group's prompt keys
    own: torch.Tensor  # [U x Hkv x G, R, C] over each row's own keys
    whole: torch.Tensor | None  # [U, Hkv, G, R, P + C] the one buffer both are slices of; None: two dense buffers


def _scores(like: torch.Tensor, U: int, Hkv: int, G: int, R: int, P: int, C: int, dense: bool) -> _Scores:
    """Two dense buffers (where native_softmax_pair takes them: bf16 products over slices rows P + C apart ran 2-2.5x
    slower), else one buffer for aten's softmax."""
    if dense:
        return _Scores(like.new_empty(U * Hkv, G * R, P), like.new_empty(U * Hkv * G, R, C), None)
    s = like.new_empty(U, Hkv, G, R, P + C)
    return _Scores(s.view(U * Hkv, G * R, P + C)[..., :P], s.view(-1, R, P + C)[..., P:], s)


def _biased_softmax_(s: _Scores, prefix_bias, prefix_starts, own_bias, U: int, Hkv: int, G: int, R: int, P: int, C: int) -> None:
    """s = softmax(s + [prefix_bias | own_bias]) in place; prefix_bias [U, 1, 1, 1, P] or None, prefix_starts [U] (the
    same mask as left padding: the first key each group attends) or None (no padding, or not left padding), own_bias
    [U or 1, 1, G or 1, 1, C, C]."""
    if prefix_bias is not None and (s.whole is not None or prefix_starts is None):
        s.prompt.view(U, Hkv, G, R, P).add_(prefix_bias)
    if s.whole is None:  # the kernel masks the padding and adds the own bias on its way
        own = own_bias.view(own_bias.shape[0], own_bias.shape[2], C, C)  # [U or 1, G or 1, C, C]
        native_softmax_pair.softmax_(s.prompt, s.own, prefix_starts, own, U, Hkv, G)
        return
    s.own.view(U, Hkv, G, R // C, C, C).add_(own_bias)
    torch.ops.aten._softmax.out(s.whole, -1, False, out=s.whole)


def _softmax_backward_(d: _Scores, p: _Scores) -> None:
    """d = p x (d - sum(d x p)), in place."""
    if d.whole is None:
        native_softmax_pair.softmax_backward_(d.prompt, d.own, p.prompt, p.own)
    else:
        assert p.whole is not None
        torch.ops.aten._softmax_backward_data.out(d.whole, p.whole, -1, p.whole.dtype, grad_input=d.whole)


def _t_product(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """s^T x [b, n, d] for s [b, m, n] (a score buffer or a slice of one) and x [b, m, d], computed as (x^T s)^T: a view."""
    return torch.bmm(x.transpose(1, 2), s).transpose(1, 2)


class _GroupedSoftmaxProducts(torch.autograd.Function):
    """softmax([q k_prompt^T + bias_prompt | q k_own^T + bias_own]) [v_prompt; v_own] with the backward written out:
    the products write the scores of both parts into their buffers (no concatenation, no zero-filled gradient per
    part, as autograd's cat and slices would cost), and the softmax and its backward run in place (each row is read
    before it is written), so a layer holds two score-sized buffers, not four."""

    @staticmethod
    def forward(ctx, q, prefix_k, prefix_v, own_k, own_v, prefix_bias, prefix_starts, own_bias):
        # q [U, Hkv, G, R, D] (scaled; R = rep x C query rows per kv head and row), prefix_k/v [U, Hkv, P, D],
        # own_k/v [U, Hkv, G, C, D], prefix_bias [U, 1, 1, 1, P] or None, prefix_starts [U] (prefix_bias as left padding)
        # or None, own_bias broadcast to [U, Hkv, G, rep, C, C]
        U, Hkv, G, R, D = q.shape
        P, C = prefix_k.shape[2], own_k.shape[3]
        s = _scores(q, U, Hkv, G, R, P, C, dense=native_softmax_pair.applies(q.dtype, q.device))
        torch.bmm(q.view(U * Hkv, G * R, D), prefix_k.view(U * Hkv, P, D).transpose(1, 2), out=s.prompt)
        torch.bmm(q.view(-1, R, D), own_k.view(-1, C, D).transpose(1, 2), out=s.own)
        _biased_softmax_(s, prefix_bias, prefix_starts, own_bias, U, Hkv, G, R, P, C)  # in place: the scores are not needed again
        out = torch.bmm(s.prompt, prefix_v.view(U * Hkv, P, D))  # [U x Hkv, G x R, D]
        out.view(-1, R, D).baddbmm_(s.own, own_v.view(-1, C, D))
        ctx.save_for_backward(q, prefix_k, prefix_v, own_k, own_v, *s)
        return out.view(U, Hkv, G, R, D)

    @staticmethod
    def backward(ctx, d_out):
        q, prefix_k, prefix_v, own_k, own_v, *weights = ctx.saved_tensors
        p = _Scores(*weights)
        U, Hkv, G, R, D = q.shape
        P, C = prefix_k.shape[2], own_k.shape[3]
        d_out = d_out.contiguous()
        d_out_p, d_out_r = d_out.view(U * Hkv, G * R, D), d_out.view(-1, R, D)  # per kv head / per row
        d_s = _scores(p.prompt, U, Hkv, G, R, P, C, dense=p.whole is None)
        torch.bmm(d_out_p, prefix_v.view(U * Hkv, P, D).transpose(1, 2), out=d_s.prompt)
        torch.bmm(d_out_r, own_v.view(-1, C, D).transpose(1, 2), out=d_s.own)
        _softmax_backward_(d_s, p)  # p x (d_p - sum(d_p x p)), in place
        d_q = torch.bmm(d_s.prompt, prefix_k.view(U * Hkv, P, D))
        d_q.view(-1, R, D).baddbmm_(d_s.own, own_k.view(-1, C, D))
        q_p, q_r = q.view(U * Hkv, G * R, D), q.view(-1, R, D)
        # the keys' and values' gradients as (x^T s)^T, not s^T x: score slices (rows P + C apart) transposed on the
        # left made bmm copy them whole first (in bf16 2-3x the product's time); transposed on the right they are read in place
        d_prefix_k = _t_product(q_p, d_s.prompt).view(prefix_k.shape)  # summed over the group's rows
        d_prefix_v = _t_product(d_out_p, p.prompt).view(prefix_v.shape)
        d_own_k = _t_product(q_r, d_s.own).view(own_k.shape)
        d_own_v = _t_product(d_out_r, p.own).view(own_v.shape)
        return d_q.view(q.shape), d_prefix_k, d_prefix_v, d_own_k, d_own_v, None, None, None


class _Regrouped(torch.autograd.Function):
    """A group's rows under one kv head together, in the products' dtype: query [N, H, C, D] -> [U, Hkv, G, rep x C, D]
    scaled (in the wider of its dtype and fp32, rounded once to dtype), key and value [N, Hkv, C, D] -> [U, Hkv, G, C,
    D]. One copy each way per tensor: written as autograd's cast, reshape and scale they were a cast, a copy and a
    product each way (config B's micro-batch: 7 % of its time in them)."""

    @staticmethod
    def forward(ctx, query, key, value, groups: int, scale: float, dtype: torch.dtype):
        N, H, C, D = query.shape
        U, Hkv = groups, key.shape[1]
        G, rep = N // U, H // Hkv
        ctx.shapes, ctx.scale = (U, G, Hkv, rep, C, D), scale
        ctx.dtypes = query.dtype, key.dtype, value.dtype
        q = torch.empty(U, Hkv, G, rep, C, D, dtype=dtype, device=query.device)
        # the product in the wider dtype (TensorIterator's math for a bf16 input too), rounded to q's on the write
        torch.mul(query.view(U, G, Hkv, rep, C, D).transpose(1, 2), scale, out=q)
        k = torch.empty(U, Hkv, G, C, D, dtype=dtype, device=key.device)
        v = torch.empty(U, Hkv, G, C, D, dtype=dtype, device=value.device)
        k.copy_(key.view(U, G, Hkv, C, D).transpose(1, 2))
        v.copy_(value.view(U, G, Hkv, C, D).transpose(1, 2))
        return q.view(U, Hkv, G, rep * C, D), k, v

    @staticmethod
    def backward(ctx, d_q, d_k, d_v):
        U, G, Hkv, rep, C, D = ctx.shapes
        q_dtype, k_dtype, v_dtype = ctx.dtypes
        d_query = torch.empty(U, G, Hkv, rep, C, D, dtype=torch.promote_types(q_dtype, torch.float32), device=d_q.device)
        d_query.transpose(1, 2).copy_(d_q.view(U, Hkv, G, rep, C, D))
        d_query = d_query.mul_(ctx.scale).to(q_dtype).view(U * G, Hkv * rep, C, D)
        d_key = torch.empty(U, G, Hkv, C, D, dtype=k_dtype, device=d_k.device)
        d_key.transpose(1, 2).copy_(d_k)
        d_value = torch.empty(U, G, Hkv, C, D, dtype=v_dtype, device=d_v.device)
        d_value.transpose(1, 2).copy_(d_v)
        return d_query, d_key.view(U * G, Hkv, C, D), d_value.view(U * G, Hkv, C, D), None, None, None


REGROUPED = True  # False: the regrouping as autograd's cast, reshape and scale (bench A/B)


def left_padding_starts(mask: torch.Tensor) -> torch.Tensor | None:
    """Each group's first prompt key [U] where the mask [U, P] is left padding (False, then True to the end), else None."""
    pads = (~mask).sum(1)  # [U]
    return pads if bool((mask == (torch.arange(mask.shape[1], device=mask.device) >= pads[:, None])).all()) else None


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
    layout), in fp32 (fp64 for fp64 inputs). Under bf16 autocast as rlvr.models.attention.explicit_attention computes
    there: the products in bf16 from the queries scaled in fp32, the softmax computing in fp32 from bf16 scores to bf16
    weights, the output in bf16."""
    N, H, C, D = query.shape
    U, Hkv, P, _ = prefix_keys.shape
    G, rep = N // U, H // Hkv
    wide = torch.promote_types(query.dtype, torch.float32)
    dtype = torch.get_autocast_dtype(query.device.type) if torch.is_autocast_enabled(query.device.type) else wide
    # a group's rows under one kv head together: [U, Hkv, G, rep x C, D]
    if REGROUPED:
        q, own_k, own_v = _Regrouped.apply(query, key, value, U, scale, dtype)
    else:
        q = (query.to(wide).view(U, G, Hkv, rep, C, D).transpose(1, 2).reshape(U, Hkv, G, rep * C, D).contiguous() * scale).to(dtype)
        own_k = key.to(dtype).view(U, G, Hkv, C, D).transpose(1, 2).contiguous()  # [U, Hkv, G, C, D]
        own_v = value.to(dtype).view(U, G, Hkv, C, D).transpose(1, 2).contiguous()
    own_bias = additive_bias(_completion_mask(attention_mask, C, query.device), dtype)
    B = own_bias.shape[0]  # N or 1
    own_bias = own_bias.view(B // G if B > 1 else 1, G if B > 1 else 1, 1, C, C).transpose(1, 2)[:, :, :, None]  # [U, 1, G, 1, C, C]
    prefix_bias = None if bool(prefix_mask.all()) else additive_bias(prefix_mask.bool(), dtype)[:, None, None, None, :]  # [U, 1, 1, 1, P]
    starts = None if prefix_bias is None else left_padding_starts(prefix_mask.bool())  # the kernel skips those keys
    prefix_k, prefix_v = prefix_keys.to(dtype).contiguous(), prefix_values.to(dtype).contiguous()
    out = _GroupedSoftmaxProducts.apply(q, prefix_k, prefix_v, own_k, own_v, prefix_bias, starts, own_bias)  # [U, Hkv, G, rep x C, D]
    out = out.view(U, Hkv, G, rep, C, D).permute(0, 2, 4, 1, 3, 5).reshape(N, C, H, D)  # [N, C, H, D]
    return out if dtype != wide else out.to(query.dtype)  # under autocast in its dtype, as explicit_attention's
