"""The training forward's causal attention in fp32 and its backward in C (native_causal_attention.c), for
rlvr.models.attention's plain causal call: the queries of a row see the keys up to their own position (aligned to the
last key) within the row's keys that are not padding, as transformers' masks for a left- or right-padded batch say.

torch's CPU flash kernel computes every block of 512 keys for every block of queries, the half above the diagonal
included, at about a third of the machine's product rate (bench/results/op_times: 4 layers of 64 rows x 256 queries took
0.17 s forward, 0.43 s backward on an AMD EPYC). The kernel here skips the keys a block of queries does not see and runs
its products register-blocked over packed operands. The math is SDPA's; the sums run in another order (equal to
rounding, tests/models/test_native_causal_attention.py) fixed by the shapes alone, not by the thread count.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from pathlib import Path
from typing import Any, NamedTuple

import torch

from rlvr.models import native_build, prefix_attention

SOURCE = Path(__file__).with_name("native_causal_attention.c")
ON = True  # False: rlvr.models.attention keeps its other ways (bench A/Bs)
_P, _F, _T = ctypes.c_void_p, ctypes.c_float, ctypes.c_int
_SHAPES = (_P, _P, _P, _P, _P, _P, _P, _P, _F)  # q, k, v, pk, pv, shape (int64: dims and strides), start, stop, scale


MIN_VECTOR_BITS = 256  # below (SSE, another architecture) GCC splits the vectors: slower than torch's kernel (tests: 0)


@functools.cache
def _kernels() -> tuple[Any, Any, int] | None:
    """(forward, backward, the build's vector bits), or None where the kernel did not build."""
    bits = native_build.function(SOURCE, "rlvr_causal_attention_vector_bits", (), ctypes.c_int)
    if bits is None:
        return None
    forward = native_build.function(SOURCE, "rlvr_causal_attention_forward", (*_SHAPES, _P, _P, _T), ctypes.c_int)
    backward = native_build.function(SOURCE, "rlvr_causal_attention_backward", (*_SHAPES, *[_P] * 8, _T), ctypes.c_int)
    return forward, backward, int(bits())


def available() -> bool:
    """Whether the kernel built here, with vectors of MIN_VECTOR_BITS or more."""
    kernels = _kernels()
    return kernels is not None and kernels[2] >= MIN_VECTOR_BITS


class KeyRange(NamedTuple):
    """Each row's keys that are not padding, [start, stop): [B] int64 each."""

    start: torch.Tensor
    stop: torch.Tensor


# (a weak reference to the mask, its version, Lq, Lk, KeyRange or None): every layer of a forward passes the same mask
_last_mask: tuple[Any, ...] = ()


def key_range(attention_mask: torch.Tensor | None, B: int, Lq: int, Lk: int) -> KeyRange | None:
    """The mask as KeyRange where it is causal (query i sees key j <= i + Lk - Lq) within one range of keys per row, else
    None. attention_mask: bool [B or 1, 1, Lq, Lk] (True: attend), or None: causal over Lq == Lk."""
    global _last_mask
    if attention_mask is None:
        if Lq != Lk:
            return None
        zeros = torch.zeros(B, dtype=torch.int64)
        return KeyRange(zeros, zeros + Lk)
    if attention_mask.dtype != torch.bool or attention_mask.dim() != 4 or tuple(attention_mask.shape[1:]) != (1, Lq, Lk):
        return None
    if _last_mask and _last_mask[0]() is attention_mask and _last_mask[1:4] == (attention_mask._version, Lq, Lk):
        return _last_mask[4]
    found = _key_range(attention_mask[:, 0], Lq, Lk)
    if found is not None and found.start.shape[0] != B:
        found = KeyRange(found.start.expand(B).contiguous(), found.stop.expand(B).contiguous())
    _last_mask = (weakref.ref(attention_mask), attention_mask._version, Lq, Lk, found)
    return found


def prefix_key_range(prefix_mask: torch.Tensor, own_mask: torch.Tensor | None, B: int, C: int) -> KeyRange | None:
    """key_range over a row's P prompt keys (its group's: prefix_mask [U, P] bool, True = a prompt token) then its C own
    keys (own_mask as key_range takes it over C queries), where the prompt is left-padded and the own keys start at
    0: one range of keys per row; else None."""
    U, P = prefix_mask.shape
    pads = prefix_attention.left_padding_starts(prefix_mask.bool().cpu())  # [U]
    if pads is None or B % U:
        return None
    own = key_range(own_mask, B, C, C)
    if own is None or bool((own.start > 0).any()):
        return None
    return KeyRange(pads.repeat_interleave(B // U).contiguous(), (own.stop + P).contiguous())


def _key_range(mask: torch.Tensor, Lq: int, Lk: int) -> KeyRange | None:
    """key_range of mask [B, Lq, Lk], checked whole."""
    last = mask[:, -1].cpu()  # [B, Lk] the last query sees every key of its row's range
    keys = torch.arange(Lk)
    seen = last.any(dim=1)
    start = torch.where(seen, torch.where(last, keys, Lk).amin(dim=1), 0)
    stop = torch.where(seen, torch.where(last, keys + 1, 0).amax(dim=1), 0)
    inside = (keys >= start[:, None]) & (keys < stop[:, None])  # [B, Lk]
    causal = keys[None, :] <= torch.arange(Lq)[:, None] + (Lk - Lq)  # [Lq, Lk]
    if not torch.equal(mask.cpu(), causal[None] & inside[:, None]):
        return None
    return KeyRange(start.contiguous(), stop.contiguous())


class _Call(NamedTuple):
    """A call's tensors (row-major in D) and the kernel's leading arguments."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    pk: torch.Tensor  # [U, Hkv, P, D], P 0 without a prompt
    pv: torch.Tensor
    shape: torch.Tensor  # int64: B, H, Hkv, Lq, C, P, G, D, then the strides of q, k, v, pk, pv
    keys: KeyRange
    scale: float

    def args(self) -> tuple:
        t = (self.q, self.k, self.v, self.pk, self.pv, self.shape, self.keys.start, self.keys.stop)
        return (*(x.data_ptr() for x in t), self.scale)


def _call(query, key, value, prefix_keys, prefix_values, keys: KeyRange, scale: float) -> _Call:
    q, k, v = (_row_major(t.detach()) for t in (query, key, value))
    B, H, Lq, D = q.shape
    if prefix_keys is None:
        pk = pv = k.new_empty(1, k.shape[1], 0, D)
    else:
        pk, pv = (_row_major(t.detach()) for t in (prefix_keys, prefix_values))
    P, G = pk.shape[2], B // pk.shape[0]
    dims = [B, H, k.shape[1], Lq, k.shape[2], P, G, D] + [s for t in (q, k, v, pk, pv) for s in t.stride()[:3]]
    return _Call(q, k, v, pk, pv, torch.tensor(dims, dtype=torch.int64), keys, scale)


def _row_major(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class _CausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, prefix_keys, prefix_values, keys: KeyRange, scale: float):
        kernels = _kernels()
        assert kernels is not None
        call = _call(query, key, value, prefix_keys, prefix_values, keys, scale)
        B, H, Lq, D = call.q.shape
        out = call.q.new_empty(B, Lq, H, D)
        lse = call.q.new_empty(B, H, Lq)
        rc = kernels[0](*call.args(), out.data_ptr(), lse.data_ptr(), torch.get_num_threads())
        if rc:
            raise RuntimeError(f"native causal attention: forward failed ({'shapes' if rc == 1 else 'out of memory'})")
        ctx.save_for_backward(out, lse)
        ctx.call, ctx.prefix = call, prefix_keys is not None
        return out

    @staticmethod
    def backward(ctx, d_out):
        kernels = _kernels()
        assert kernels is not None
        out, lse = ctx.saved_tensors
        call: _Call = ctx.call
        d_out = d_out.contiguous()
        B, H, Lq, D = call.q.shape
        Hkv, C, P = call.k.shape[1], call.k.shape[2], call.pk.shape[2]
        dq, dk, dv = call.q.new_empty(B, Lq, H, D), call.k.new_empty(B, Hkv, C, D), call.k.new_empty(B, Hkv, C, D)
        dpk, dpv = call.k.new_empty(B, Hkv, P, D), call.k.new_empty(B, Hkv, P, D)  # each row's part of its prompt's
        grads = (out, d_out, lse, dq, dk, dv, dpk, dpv)
        rc = kernels[1](*call.args(), *(t.data_ptr() for t in grads), torch.get_num_threads())
        if rc:
            raise RuntimeError(f"native causal attention: backward failed ({'shapes' if rc == 1 else 'out of memory'})")
        if not ctx.prefix:
            return dq.transpose(1, 2), dk, dv, None, None, None, None
        U = call.pk.shape[0]
        dpk, dpv = (t.view(U, B // U, Hkv, P, D).sum(1) for t in (dpk, dpv))  # summed over each group's rows
        return dq.transpose(1, 2), dk, dv, dpk, dpv, None, None


def causal_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    keys: KeyRange,
    scale: float,
    prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """softmax(q k^T x scale, over the keys each query sees) v: query [B, H, Lq, D], key / value [B, Hkv, C, D] fp32 on
    the CPU (H a multiple of Hkv, grouped as transformers' repeat_kv); prefix: (keys, values) [B / G, Hkv, P, D] of a
    prompt shared by each G consecutive rows, before each row's own keys (rlvr.models.prefix_attention); keys:
    key_range's over a row's P + C keys. [B, Lq, H, D] (transformers' layout), 0 for a query that sees no key.
    Differentiable in query, key, value and the prefix's keys and values."""
    pk, pv = prefix if prefix is not None else (None, None)
    return _CausalAttention.apply(query, key, value, pk, pv, keys, scale)
