"""sample_tokens's draw for rows without a filter (no top-k, top-p or min-p) as one C pass per row on the CPU, where
it builds with AVX2 or AVX-512 vectors (native_sampler.c); sampling.py's torch ops elsewhere.

The same algorithm as the torch path (inverse-CDF over fp32 block sums and their float64 running total, one random
number per row, the log-prob and entropy by the training forward's formula) in two passes over each row instead of
six and two [n, V] temporaries: the vocabulary-wide part of a decode step at 32k-152k tokens. Its weights come from
the kernel's own exp (rlvr.models.native_lanes.h, as the training forward's log-probs on the CPU), so a token differs
from the torch path's only where u x Z falls within a rounding of a boundary. Vocabularies of at most
sampling.DIRECT_CDF_MAX tokens keep the torch path (its one float64 cumsum; a few microseconds there).
tests/rollout/test_native_sampler.py checks it against float64.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from rlvr.models import native_build

SOURCE = Path(__file__).with_name("native_sampler.c")
ON = True  # False: sampling.py's torch ops always (bench/native_sampler_ab.py's "before")
MIN_VOCAB = 1025  # sampling.DIRECT_CDF_MAX + 1: up to it the torch path's single cumsum
_P, _I = ctypes.c_void_p, ctypes.c_int64
# logits, bf16, row stride, n, V, T, u (float64), block sums scratch, token, logp, entropy (or None), threads
_ARGS = (_P, ctypes.c_int, _I, _I, _I, ctypes.c_float, _P, _P, _P, _P, _P, ctypes.c_int)
CDF_BLOCK = 64  # native_sampler.c's (sampling.CDF_BLOCK)


@functools.cache
def _kernel() -> Any:
    return native_build.function(SOURCE, "rlvr_sample_rows", _ARGS)


@functools.cache
def vector_bits() -> int:
    """The build's vector width: 512 (AVX-512), 256 (AVX2), 0 where its loops run split into narrower registers or it
    did not build (native_build.why_not(SOURCE) says why)."""
    fn = native_build.function(SOURCE, "rlvr_sampler_vector_bits", (), ctypes.c_int)
    return 0 if fn is None else int(fn())


def applies(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> bool:
    """Whether sample_rows draws for these logits [n, V] and filters: none of the filters, bf16 or fp32 rows on the
    CPU (V contiguous, more than MIN_VOCAB - 1 tokens), the kernel built with AVX2 or AVX-512."""
    V = logits.shape[-1]
    unfiltered = (not top_k or top_k >= V) and top_p >= 1.0 and min_p <= 0.0
    rows = logits.dim() == 2 and logits.device.type == "cpu" and logits.dtype in (torch.bfloat16, torch.float32) and logits.stride(-1) == 1
    return ON and unfiltered and rows and V >= MIN_VOCAB and vector_bits() >= 256


def sample_rows(
    logits: torch.Tensor,  # [n, V] bf16 or fp32 on the CPU, V contiguous (not written)
    uniforms: torch.Tensor,  # [n] in [0, 1)
    temperature: float,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(token [n] int64, its log-prob [n] fp32, the row's entropy [n] fp32 or None): sample_tokens's outputs for
    unfiltered rows (module docstring)."""
    fn = _kernel()
    assert fn is not None, f"the native sampler did not build: {native_build.why_not(SOURCE)}"
    assert logits.dim() == 2 and logits.stride(-1) == 1 and logits.dtype in (torch.bfloat16, torch.float32) and temperature > 0
    n, V = logits.shape
    u = uniforms.to(torch.float64).contiguous()
    threads = torch.get_num_threads()
    sums = torch.empty(threads, -(-V // CDF_BLOCK), dtype=torch.float32)
    token = torch.empty(n, dtype=torch.int64)
    logp = torch.empty(n, dtype=torch.float32)
    entropy = torch.empty(n, dtype=torch.float32) if with_entropy else None
    fn(
        logits.data_ptr(), logits.dtype == torch.bfloat16, logits.stride(0), n, V, float(temperature), u.data_ptr(),
        sums.data_ptr(), token.data_ptr(), logp.data_ptr(), None if entropy is None else entropy.data_ptr(), threads,
    )  # fmt: skip
    return token, logp, entropy
