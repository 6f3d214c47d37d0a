"""The lean decode's rotation of the new token's q and k and its write of k and v into the KV buffers, as one C pass.

native_rotary.c does per row what `rotate` (rlvr.models.norm_rotary) and the buffers' slot copies do in ten torch
ops a layer, with their bits: the same products and sums in float, no fused multiply-add, bf16 rounded to nearest
even. The eager CPU step calls it wherever it builds and the inputs are its dtypes (fp32 cos and sin), whichever way the
attention runs after it (decode_attention.py: until 2026-12-07 only with the C attention kernel, so the shared layout's
flash way, configs C and F, kept the ten ops). tests/rollout/test_native_rotary.py checks it against the torch ops, bit
for bit.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from rlvr.models import native_build

SOURCE = Path(__file__).with_name("native_rotary.c")
_P, _I, _B = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# q and its strides (row, head), k's, v's, whether each is bf16, cos, sin, their row stride, q_out, the key buffer's
# slot and strides, the value buffer's, each row's slot (or NULL), whether they are bf16, n, Hq, Hkv, D, threads
_ARGS = (_P, _I, _I, _P, _I, _I, _P, _I, _I, _B, _B, _B, _P, _P, _I, _P, _P, _I, _I, _P, _I, _I, _P, _B, _I, _I, _I, _I, _B)
DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def _kernel() -> Any:
    return native_build.function(SOURCE, "rlvr_rotate_write", _ARGS, ctypes.c_int)


def available() -> bool:
    """Whether the kernel is built and loaded in this process (native_build.why_not(SOURCE) says why not)."""
    return _kernel() is not None


def fits(*tensors: torch.Tensor) -> bool:
    """Whether the kernel takes these inputs and buffers: fp32 or bf16, on the CPU (the buffers of one dtype)."""
    return all(x.dtype in DTYPES and x.device.type == "cpu" for x in tensors) and tensors[-1].dtype == tensors[-2].dtype


def rotate_and_write(
    q: torch.Tensor,  # [n, Hq, D] fp32 or bf16, D contiguous (a view of the q/k/v product's output)
    k: torch.Tensor,  # [n, Hkv, D] fp32 or bf16 (fp32 after qwen3's per-head norm under autocast, v bf16), as q
    v: torch.Tensor,  # [n, Hkv, D] fp32 or bf16, as q
    cos: torch.Tensor,  # [n, 1, D] fp32
    sin_signed: torch.Tensor,  # [n, 1, D] fp32, first half negated (norm_rotary.signed_sin)
    own_k: torch.Tensor,  # [n, Hkv, S, D] fp32 or bf16, D contiguous
    own_v: torch.Tensor,  # [n, Hkv, S, D] as own_k
    t: int,  # the slot written
) -> torch.Tensor:
    """q rotated [n, Hq, D] fp32, with k rotated and v written at slot t of own_k / own_v: rotate(q), rotate(k) and the
    slot's copies, the same bits."""
    assert 0 <= t < own_k.shape[2] and own_k.shape == own_v.shape and own_k.shape[0] == q.shape[0]
    return _rotate_write(q, k, v, cos, sin_signed, own_k, own_v, t, None)


def rotate_and_write_at(
    q: torch.Tensor,  # [n, Hq, D] as rotate_and_write's
    k: torch.Tensor,  # [n, Hkv, D]
    v: torch.Tensor,  # [n, Hkv, D]
    cos: torch.Tensor,  # [n, 1, D] fp32
    sin_signed: torch.Tensor,  # [n, 1, D] fp32, first half negated
    keys: torch.Tensor,  # [N, Hkv, S, D] fp32 or bf16, D contiguous: every row's buffers (multi-turn episodes)
    values: torch.Tensor,  # [N, Hkv, S, D] as keys, the same strides
    slot_at: torch.Tensor,  # [n] int64: row i's slot begins at element slot_at[i] of keys and of values (slot_offsets)
) -> torch.Tensor:
    """rotate_and_write with each row's k and v written at a buffer row and slot of its own: rows at lengths of their
    own (multi-turn episodes). The caller keeps slot_at in range (slot_offsets of rows and slots inside the buffers)."""
    assert keys.shape == values.shape and keys.stride() == values.stride(), "one offset serves both buffers"
    assert slot_at.dtype == torch.int64 and slot_at.shape == (q.shape[0],) and slot_at.is_contiguous()
    return _rotate_write(q, k, v, cos, sin_signed, keys, values, 0, slot_at)


def slot_offsets(buffer: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """[n] int64: where slot slots[i] of buffer row rows[i] begins, in elements of `buffer` ([N, H, S, D]), as
    rotate_and_write_at reads it."""
    assert int(rows.min()) >= 0 and int(rows.max()) < buffer.shape[0] and int(slots.min()) >= 0 and int(slots.max()) < buffer.shape[2]
    return (rows * buffer.stride(0) + slots * buffer.stride(2)).contiguous()


def _rotate_write(q, k, v, cos, sin_signed, own_k, own_v, t: int, slot_at: torch.Tensor | None) -> torch.Tensor:
    fn = _kernel()
    assert fn is not None, f"the native rotary kernel did not build: {native_build.why_not(SOURCE)}"
    # called once per layer and token: each check reads what the call needs anyway (a tensor's shape or strides
    # costs a Python call, about 20 us in all for the checks torch's ops would make)
    n, Hq, D = q.shape
    Hkv = k.shape[1]
    qs, ks, vs, cs, kb, vb = q.stride(), k.stride(), v.stride(), cos.stride(), own_k.stride(), own_v.stride()
    assert fits(q, k, v, own_k, own_v), (q.dtype, k.dtype, v.dtype, own_k.dtype, own_v.dtype)
    assert qs[2] == ks[2] == vs[2] == kb[3] == vb[3] == cs[2] == 1 and cs == sin_signed.stride(), "D contiguous"
    assert own_k.shape[1] == Hkv and k.shape == v.shape and cos.shape == (n, 1, D)
    out = torch.empty(n, Hq, D, dtype=torch.float32)
    slot = t * own_k.element_size()  # slot t begins slot x stride(2) bytes in (the buffers share their dtype)
    failed = fn(
        q.data_ptr(), qs[0], qs[1], k.data_ptr(), ks[0], ks[1], v.data_ptr(), vs[0], vs[1],
        q.dtype == torch.bfloat16, k.dtype == torch.bfloat16, v.dtype == torch.bfloat16,
        cos.data_ptr(), sin_signed.data_ptr(), cs[0], out.data_ptr(), own_k.data_ptr() + slot * kb[2], kb[0], kb[1],
        own_v.data_ptr() + slot * vb[2], vb[0], vb[1], None if slot_at is None else slot_at.data_ptr(),
        own_k.dtype == torch.bfloat16, n, Hq, Hkv, D, torch.get_num_threads(),
    )  # fmt: skip
    assert failed == 0, f"native rotary: head dim {D} is odd or above the kernel's 512"
    return out
