"""Attention for the training forward on the CPU: short sequences by explicit products.

torch's CPU flash-attention kernel (what SDPA runs there) is slow in the backward of short sequences: for 64 rows of
72 tokens (12 heads of 64, 4 kv heads, bf16 autocast) its forward + backward takes about 150 ms per layer, where the
same attention as two batched products and a softmax takes about 25 ms (bench/attention_cpu.py ->
bench/results/attention_cpu.md). Past a number of query x key positions per head the explicit score matrices cost
more memory traffic than the kernel saves, and SDPA wins again: about 150 x 150 where the weights are kept in fp32,
about 300 x 300 where bf16 autocast keeps them in bf16 (EXPLICIT_MAX). So the training forward (the one forward
with a gradient) computes such attention explicitly and hands everything else to transformers' SDPA function
unchanged: the no-gradient forwards, long sequences, dropout, soft-capping, other devices, torch.compile. Long causal
rows of grouped-query heads are the exception: the kernel splits the keys in blocks of 512 and skips none of the
scores above the diagonal, so they run as SDPA per chunk of the queries over the keys each chunk sees (causal_sdpa).
In fp32 without autocast every plain causal call (each row's keys one range, as left- and right-padded batches give,
over a shared prompt too) runs ahead of all those in C (rlvr.models.native_causal_attention): forward + backward
0.53-0.89x the time of the best of them at every shape measured, 48-1024 queries (bench/results/causal_attention_native_amd.md).

The math is SDPA's: softmax(q k^T x scale + mask) v, grouped-query heads reading their kv head (transformers'
repeat_kv order). In fp32 (and fp64) it equals SDPA up to rounding; under bf16 autocast the two products run in bf16
and the softmax computes in fp32 from bf16 scores to bf16 weights (transformers' eager attention keeps fp32 weights
and casts them for the product; SDPA's kernel keeps its scores in fp32: all three are bf16 approximations, and
tests/models/test_training_attention.py holds this one as close to the fp32 truth as SDPA). A query
position whose keys are all masked (left padding) gets a uniform average instead of SDPA's zeros: its output only
ever reaches other padding positions, whose log-probs are cut before the loss, so real tokens' log-probs and every
gradient are the same.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, NamedTuple

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rlvr.models import native_causal_attention, prefix_attention

NAME = "rlvr_train"


class Bounds(NamedTuple):
    """Where the explicit products run rather than the flash kernel."""

    scores: int  # query x key positions per head, up to which they beat the kernel forward + backward
    elements: int  # scores in all (rows x heads x Lq x Lk): autograd keeps each layer's weights for the backward,
    # where the kernel keeps one log-sum-exp per query


# bench/results/attention_cpu.md, forward + backward, 2 threads, AMD EPYC.
EXPLICIT_MAX = {
    # bf16 autocast: the weights kept in bf16 (2 bytes a score). 0.2-0.5x the kernel's time up to 160 x 160 and for
    # completions over 259-600 prompt positions (0.65-0.85x with 8 heads of 64), 0.5-1.0x from 192 x 192 to 300 x 300,
    # level within this machine's noise (0.8-1.15x) at 512 x 512 and 1024 x 1024, where the kernel (causal rows) skips
    # half the scores and keeps none. Elements: the same 96 MiB a layer as 2**24 weights kept in fp32 + bf16 before
    "bf16": Bounds(scores=320 * 320, elements=3 * 2**24),
    # otherwise: the weights kept in fp32 (4 bytes a score; 8 in fp64). Measured when bf16 autocast kept them in fp32
    # too: 0.2-0.4x the kernel's time up to 96 x 96, 0.4-0.6x at 128 x 128, 0.6-1.1x at 160 x 160, slower beyond
    "fp32": Bounds(scores=128 * 160, elements=2**24),
}


def _plain_training_call(query: torch.Tensor, dropout: float, kwargs: dict) -> bool:
    """Whether this call is the CPU training forward's plain attention: a gradient, no dropout, no soft-capping,
    sliding window, position bias or sinks, not under torch.compile."""
    return (
        query.device.type == "cpu"
        and query.requires_grad
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and dropout == 0.0
        and not any(kwargs.get(k) is not None for k in ("softcap", "sliding_window", "position_bias", "s_aux", "sinks"))
    )


def _explicit_pays(query: torch.Tensor, Lk: int, Hkv: int, dropout: float, kwargs: dict, *, per_head_bound: bool = True) -> bool:
    """Whether the explicit products run this call: query [B, H, Lq, D] over Lk keys of Hkv heads."""
    Lq = query.shape[2]
    bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    bounds = EXPLICIT_MAX["bf16" if bf16 else "fp32"]
    return (
        _plain_training_call(query, dropout, kwargs)
        and (not per_head_bound or Lq * Lk <= bounds.scores)
        and query.shape[0] * query.shape[1] * Lq * Lk <= bounds.elements
        and query.shape[1] % Hkv == 0
    )


# SDPA over chunks of the queries (causal_sdpa)
CHUNKED = True  # False: one SDPA call over every query (bench A/B)
CHUNK_MIN_QUERIES = 128  # fewer queries: one call
CHUNK_QUERIES = 64  # about this many queries a chunk (the flash kernel splits the queries in blocks of 64)
CHUNKS_MAX = 16


def causal_chunks(Lq: int, Lk: int) -> list[tuple[int, int, int]]:
    """(first query, query end, key end) per chunk of a causal attention aligned to the last key (query i sees keys up
    to i + Lk - Lq): one chunk below CHUNK_MIN_QUERIES queries, else about Lq / CHUNK_QUERIES of near-equal length."""
    n = 1 if Lq < CHUNK_MIN_QUERIES else max(1, min(CHUNKS_MAX, round(Lq / CHUNK_QUERIES)))
    bounds = [Lq * i // n for i in range(n + 1)]
    return [(i0, i1, i1 + Lk - Lq) for i0, i1 in zip(bounds, bounds[1:])]


def _chunk_masks(attention_mask: torch.Tensor | None, chunks: list, device) -> list[torch.Tensor] | None:
    """Each chunk's bool mask [B or 1, 1, its queries, its key end]; None where a query of some chunk sees a key past
    the chunk's end (the mask is not causal)."""
    if attention_mask is None:  # causal over Lq == Lk: query i0 + r sees keys up to i0 + r
        return [torch.ones(i1 - i0, end, dtype=torch.bool, device=device).tril(i0)[None, None] for i0, i1, end in chunks]
    if any(bool(attention_mask[:, :, i0:i1, end:].any()) for i0, i1, end in chunks):
        return None
    return [attention_mask[:, :, i0:i1, :end] for i0, i1, end in chunks]


def causal_sdpa(query, key, value, attention_mask, scale: float | None, dropout: float, kwargs: dict) -> torch.Tensor | None:
    """SDPA per chunk of the queries (causal_chunks), each over the keys it sees, [B, Lq, H, D]; None where that does
    not apply: not the plain training call, fewer than CHUNK_MIN_QUERIES queries, a kv head per query head, a mask other
    than bool [B or 1, 1, Lq, Lk] (or None over Lq == Lk: causal), or one that lets a query see a later key.

    The same math as one call, each output summed over fewer keys (only masked ones left out): equal up to rounding
    (~1e-7 relative in fp32). Grouped-query heads only: the chunks' key and value gradients are summed in memory, and
    with as many kv heads as query heads that cost about what the chunks saved (fp32, 8 heads of 64 at 259-256
    queries: 1.01-1.11x one call's time), where with 2-4 query heads per kv head forward + backward took 0.64-0.88x
    in fp32 and 0.62-0.75x under bf16 autocast at 128-1024 queries (AMD EPYC, bench/results/causal_chunks_avx2.md)."""
    Lq, Lk = query.shape[2], key.shape[2]
    grouped = query.shape[1] >= 2 * key.shape[1] and query.shape[1] % key.shape[1] == 0
    if not (CHUNKED and grouped and Lq >= CHUNK_MIN_QUERIES and Lk >= Lq and _plain_training_call(query, dropout, kwargs)):
        return None
    if attention_mask is None:
        if Lq != Lk:
            return None
    elif attention_mask.dtype != torch.bool or attention_mask.dim() != 4 or tuple(attention_mask.shape[-2:]) != (Lq, Lk):
        return None
    return chunked_sdpa(query, key, value, attention_mask, scale)


def chunked_sdpa(query, key, value, attention_mask: torch.Tensor | None, scale: float | None) -> torch.Tensor | None:
    """causal_sdpa's work without its conditions, [B, Lq, H, D]; None where a query sees a key past its chunk's end."""
    chunks = causal_chunks(query.shape[2], key.shape[2])
    masks = _chunk_masks(attention_mask, chunks, query.device)
    if masks is None:
        return None
    return _ChunkedSDPA.apply(query, key, value, chunks, masks, scale).transpose(1, 2).contiguous()  # [B, Lq, H, D]


class _ChunkedSDPA(torch.autograd.Function):
    """SDPA per chunk of queries over the keys [0, end) they see, [B, H, Lq, D]. Each chunk's call keeps its own
    graph, and the backward sums the chunks' key and value gradients into one buffer in place (autograd over the
    slices gave every chunk a zero-filled gradient the size of all the keys, then added those up)."""

    @staticmethod
    def forward(ctx, query, key, value, chunks, masks, scale):
        gqa = query.shape[1] != key.shape[1]  # the kernel reads each query head's kv head (transformers' repeat_kv order)
        ctx.chunks, ctx.calls, outs = chunks, [], []
        with torch.enable_grad():
            for (i0, i1, end), mask in zip(chunks, masks):
                q, k, v = (t.requires_grad_() for t in (query.detach()[:, :, i0:i1], key.detach()[:, :, :end], value.detach()[:, :, :end]))
                out = F.scaled_dot_product_attention(q, k, v, mask, scale=scale, enable_gqa=gqa)
                ctx.calls.append((out, (q, k, v)))
                outs.append(out.detach())
        ctx.like = [(t.shape, t.dtype) for t in (query, key, value)]  # the gradients'
        return torch.cat(outs, dim=2)

    @staticmethod
    def backward(ctx, d_out):
        (q_shape, q_dtype), (k_shape, k_dtype), (v_shape, v_dtype) = ctx.like
        d_query = torch.empty(q_shape, dtype=q_dtype, device=d_out.device)
        d_key = torch.zeros(k_shape, dtype=k_dtype, device=d_out.device)
        d_value = torch.zeros(v_shape, dtype=v_dtype, device=d_out.device)
        for (i0, i1, end), (out, parts) in zip(ctx.chunks, ctx.calls):
            dq, dk, dv = torch.autograd.grad(out, parts, d_out[:, :, i0:i1])
            d_query[:, :, i0:i1] = dq
            d_key[:, :, :end] += dk
            d_value[:, :, :end] += dv
        ctx.calls = ctx.like = None
        return d_query, d_key, d_value, None, None, None


def _native_applies(query, key, value, dropout: float, kwargs: dict, *more: torch.Tensor) -> bool:
    """Whether the C kernel (native_causal_attention) can run this call: the plain training call in fp32 without
    autocast, at least a (row, kv head) per thread."""
    B, H = query.shape[:2]
    Hkv = key.shape[1]
    return (
        native_causal_attention.ON
        and all(t.dtype == torch.float32 for t in (query, key, value, *more))
        and not torch.is_autocast_enabled("cpu")
        and _plain_training_call(query, dropout, kwargs)
        and H % Hkv == 0
        and B * Hkv >= torch.get_num_threads()
        and native_causal_attention.available()
    )


def _native_keys(query, key, value, attention_mask, dropout: float, kwargs: dict) -> native_causal_attention.KeyRange | None:
    """The keys each row sees where the C kernel runs this call: _native_applies, and a causal mask within one range
    of keys per row."""
    if not _native_applies(query, key, value, dropout, kwargs):
        return None
    return native_causal_attention.key_range(attention_mask, query.shape[0], query.shape[2], key.shape[2])


def _native_prefix_keys(
    query, key, value, attention_mask, prefix_keys, prefix_mask, dropout: float, kwargs: dict
) -> native_causal_attention.KeyRange | None:
    """_native_keys over a shared prompt's keys then each row's own (prefix_attention)."""
    if not _native_applies(query, key, value, dropout, kwargs, prefix_keys):
        return None
    return native_causal_attention.prefix_key_range(prefix_mask, attention_mask, query.shape[0], key.shape[2])


def explicit_attention(
    query: torch.Tensor,  # [B, H, Lq, D]
    key: torch.Tensor,  # [B, Hkv, Lk, D]
    value: torch.Tensor,  # [B, Hkv, Lk, D]
    attention_mask: torch.Tensor | None,  # [B or 1, 1, Lq, Lk]: bool (True = attend) or additive; None = causal
    scale: float,
) -> torch.Tensor:
    """softmax(q k^T x scale + mask) v, [B, Lq, H, D] (transformers' layout). The softmax computes in fp32 (fp64 for
    fp64 inputs); the products in fp32 too, or in autocast's dtype under autocast, where the output stays in it (as
    SDPA's) and, under bf16, the softmax reads the products' bf16 scores and writes bf16 weights."""
    B, H, Lq, D = query.shape
    Hkv, Lk = key.shape[1], key.shape[2]
    rep, dtype = H // Hkv, torch.promote_types(query.dtype, torch.float32)
    # the scale on the queries and the mask as an added bias: the score matrices (the largest tensors here) get one
    # elementwise pass forward and none backward (an add passes its gradient through), where scaling the scores and
    # masked_fill took two forward and two backward
    q = query.to(dtype).reshape(B, Hkv, rep * Lq, D) * scale  # a kv head's queries together (a copy: query is transposed)
    s = torch.matmul(q, key.to(dtype).transpose(-1, -2)).view(B, Hkv, rep, Lq, Lk)  # [B, Hkv, rep, Lq, Lk]
    if attention_mask is None and Lq > 1:
        attention_mask = torch.ones(Lq, Lk, dtype=torch.bool, device=query.device).tril()[None, None]
    if attention_mask is not None:
        s = s + prefix_attention.additive_bias(attention_mask, s.dtype)[:, :, None]  # [B or 1, 1, 1, Lq, Lk]
    # under bf16 autocast the scores are bf16 and the weights are written in bf16 (torch's kernel computes in fp32
    # inside): the product with v reads bf16 weights either way, and autograd keeps 2 bytes a score, not an fp32
    # copy for the softmax's backward plus a bf16 one for the product's; forward + backward 0.43-0.64x the time at
    # 48-128 x 128-323 positions, 0.83-0.97x at 72 x 72 (bench/results/attention_bf16_weights_amd.md), and faster than
    # the flash kernel to 300 x 300 (EXPLICIT_MAX, bench/results/attention_cpu.md)
    p = (torch.softmax(s, dim=-1) if s.dtype == torch.bfloat16 else torch.softmax(s, dim=-1, dtype=dtype)).view(B, Hkv, rep * Lq, Lk)
    out = torch.matmul(p, value.to(dtype)).view(B, H, Lq, D).transpose(1, 2)
    return out.contiguous() if torch.is_autocast_enabled(query.device.type) else out.to(query.dtype).contiguous()


GROUPED_UNDER_BF16 = True  # False: under bf16 autocast the prompt's keys repeated per row (bench/prefix_attention_ab.py's keys-repeated)


def _grouped_dtype_ok(query: torch.Tensor) -> bool:
    """Whether the grouped prompt products run in this forward's precision: without autocast, or under bf16 autocast
    (explicit_attention's bf16 products with the prompt's keys once per group: a micro-batch 0.94-0.96x the time over
    the repeated keys on ~260-token prompts, level on short ones; bench/results/grouped_prefix_bf16_ab_amd.md)."""
    if not torch.is_autocast_enabled(query.device.type):
        return True
    return GROUPED_UNDER_BF16 and torch.get_autocast_dtype(query.device.type) == torch.bfloat16


def training_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention-function contract: explicit products where they pay (module docstring), else SDPA;
    inside prefix_attention.shared_prefix, over the group's prompt as well."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if (prefix := prefix_attention.take(module)) is not None:
        prefix_keys, prefix_values, prefix_mask, G = prefix
        if (keys := _native_prefix_keys(query, key, value, attention_mask, prefix_keys, prefix_mask, dropout, kwargs)) is not None:
            return native_causal_attention.causal_attention(query, key, value, keys, scale, (prefix_keys, prefix_values)), None
        # no bound per head: the prompt's products are large ones here, and the kernel would take the repeated keys
        Lk = prefix_keys.shape[2] + key.shape[2]
        if _grouped_dtype_ok(query) and _explicit_pays(query, Lk, key.shape[1], dropout, kwargs, per_head_bound=False):
            out = prefix_attention.grouped_prefix_attention(query, key, value, attention_mask, *prefix[:3], scale)  # keys, values, mask
            return out, None
        key, value, attention_mask = prefix_attention.repeated(key, value, attention_mask, prefix_keys, prefix_values, prefix_mask, G)
    # a mask, or None for causal over equal lengths or one query
    known_mask = attention_mask is not None or query.shape[2] in (1, key.shape[2])
    if known_mask and (keys := _native_keys(query, key, value, attention_mask, dropout, kwargs)) is not None:
        return native_causal_attention.causal_attention(query, key, value, keys, scale), None
    if not (known_mask and _explicit_pays(query, key.shape[2], key.shape[1], dropout, kwargs)):
        if known_mask and (chunked := causal_sdpa(query, key, value, attention_mask, scaling, dropout, kwargs)) is not None:
            return chunked, None
        kwargs.update(dropout=dropout, scaling=scaling, is_causal=is_causal)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return explicit_attention(query, key, value, attention_mask, scale), None


AttentionInterface.register(NAME, training_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks SDPA gets


def activation_checkpointing(model) -> bool:
    """Whether the model recomputes its forward in the backward (transformers' activation/gradient checkpointing)."""
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.2x; before, its old name
    return bool(getattr(model, "is_gradient_checkpointing", False) if checkpointing is None else checkpointing)


@contextlib.contextmanager
def short_attention_explicit(model) -> Iterator[None]:
    """Inside the block a model that runs SDPA runs `training_attention` (the same math); others as they are, and so
    does a model under gradient checkpointing: its backward recomputes the forward after the block, with SDPA, and
    keeping the attention weights is what checkpointing is there to avoid."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if config is None or impl != "sdpa" or activation_checkpointing(model):
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = impl
