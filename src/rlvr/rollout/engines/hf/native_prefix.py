"""The shared layout's prompt part of the lean decode's attention and its merge with the rows' own part, as one C kernel
(native_prefix.c), where it builds.

A group's queries (its rows' R query heads per kv head) against the prompt's keys and values, which the group's rows
share, then the exact merge with the own part that native_attention.py computed: the two log-sum-exps weigh the two
outputs. The keys are kept transposed for it, once per decode (`transposed_keys`): the prompt does not change while the
rows decode, and the kernel's score products then need no sums across vector lanes. decode_attention_way times this
way beside SDPA's flash kernel and the explicit products and keeps the fastest (decode_attention.py). Built once per
machine by rlvr.models.native_build; `available()` is False where it cannot be or where the build has no vectors of
256 bits or more (then the decode keeps its other ways). tests/rollout/test_native_prefix.py checks it against float64.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from rlvr.models import native_build

SOURCE = Path(__file__).with_name("native_prefix.c")
KPAD = 32  # the transposed keys' slots padded to a multiple of this (native_prefix.c's KPAD)
MAX_D = 512  # the longest head it takes (native_prefix.c's MAX_D)
_P, _I = ctypes.c_void_p, ctypes.c_int64
# q, kt and its strides (group, head), Pp, v and its strides (group, head, slot), bias and its row stride, rows, G,
# o_own, lse_own, out, n, B, H, R, D, P, scale, threads
_ARGS = (_P, _P, _I, _I, _I, _P, _I, _I, _I, _P, _I, _P, _I, _P, _P, _P, _I, _I, _I, _I, _I, _I, ctypes.c_float, ctypes.c_int)


@functools.cache
def _kernels() -> dict[torch.dtype, Any] | None:
    names = {torch.float32: "rlvr_prefix_f32", torch.bfloat16: "rlvr_prefix_bf16"}
    kernels = {dtype: native_build.function(SOURCE, name, _ARGS, ctypes.c_int) for dtype, name in names.items()}
    return None if None in kernels.values() else kernels


@functools.cache
def vector_bits() -> int:
    """The bits of the build's vectors: 512 (AVX-512), 256 (AVX2), 0 (SSE or another architecture) or -1 (not built)."""
    fn = native_build.function(SOURCE, "rlvr_prefix_vector_bits", (), ctypes.c_int)
    return -1 if fn is None else int(fn())


def available() -> bool:
    """Whether the decode may run it: built here with vectors of 256 bits or more (built for SSE or another
    architecture's registers GCC splits its vectors lane by lane: correct, slower than the flash kernel)."""
    return _kernels() is not None and vector_bits() >= 256


def transposed_keys(k: torch.Tensor) -> torch.Tensor:
    """The prompt's keys [B, Hkv, P, D] as the kernel reads them: transposed in blocks of KPAD slots, [B, Hkv, Pp / KPAD,
    D, KPAD] (Pp = P rounded up to KPAD, the slots past P zero)."""
    B, H, P, D = k.shape
    Pp = -(-P // KPAD) * KPAD
    padded = k.new_zeros(B, H, Pp, D)
    padded[:, :, :P] = k
    return padded.view(B, H, Pp // KPAD, KPAD, D).transpose(-1, -2).contiguous()


def prefix_merged(
    q: torch.Tensor,  # [n, Hkv, R, D] fp32: the rows' queries (R query heads per kv head)
    kt: torch.Tensor,  # [B, Hkv, Pp / KPAD, D, KPAD] the prompts' keys, transposed_keys
    v: torch.Tensor,  # [B, Hkv, P, D] the prompts' values, kt's dtype (fp32 or bf16), D contiguous
    bias: torch.Tensor,  # [B, 1, 1, P] fp32, 0 or -inf (left padding; a -inf slot is not read)
    rows: torch.Tensor,  # [n] int64 ascending: each row's place b x G + g among the B x G
    group_size: int,
    scale: float,
    o_own: torch.Tensor,  # [n, Hkv, R, D] fp32: the own part's output (native_attention)
    lse_own: torch.Tensor,  # [n, Hkv, R] fp32: its log-sum-exps
) -> torch.Tensor:
    """softmax over (prompt + own slots) of each query, [n, Hkv, R, D] fp32: the prompt part of each row's group merged
    with the row's own part by their log-sum-exps."""
    kernels = _kernels()
    assert kernels is not None, f"the native prefix kernel did not build: {native_build.why_not(SOURCE)}"
    n, H, R, D = q.shape
    B, P = v.shape[0], v.shape[2]
    assert q.dtype == o_own.dtype == lse_own.dtype == bias.dtype == torch.float32 and kt.dtype == v.dtype and kt.dtype in kernels
    Pp = kt.shape[2] * KPAD
    assert kt.shape[:2] == (B, H) and kt.shape[3:] == (D, KPAD) and Pp >= P and kt.stride()[2:] == (D * KPAD, KPAD, 1)
    assert D <= MAX_D, f"native prefix: head dim D = {D} over the kernel's {MAX_D}"
    assert v.shape[:2] == (B, H) and v.shape[3] == D and v.stride(3) == 1
    assert bias.shape == (B, 1, 1, P) and bias.stride(3) == 1 and rows.dtype == torch.int64 and rows.shape == (n,)
    assert o_own.shape == q.shape and lse_own.shape == q.shape[:3] and q.device.type == "cpu"
    q, o_own, lse_own, rows = q.contiguous(), o_own.contiguous(), lse_own.contiguous(), rows.contiguous()
    out = torch.empty_like(q)
    failed = kernels[kt.dtype](
        q.data_ptr(), kt.data_ptr(), kt.stride(0), kt.stride(1), Pp, v.data_ptr(), *v.stride()[:3],
        bias.data_ptr(), bias.stride(0), rows.data_ptr(), group_size, o_own.data_ptr(), lse_own.data_ptr(), out.data_ptr(),
        n, B, H, R, D, P, scale, torch.get_num_threads(),
    )  # fmt: skip
    assert failed == 0, f"native prefix: head dim {D} or padding {Pp} refused"
    return out
