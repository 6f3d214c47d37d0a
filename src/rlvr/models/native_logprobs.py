"""The training forward's per-token log-probs and entropies (rlvr.algo.token_logprobs's math and contract) as one C
pass per token row forward and one backward, where the kernel builds; algo.token_logprobs elsewhere.

torch's ops, however fused, cast each chunk of bf16 logits to fp32 and pass over it six times forward and three or
four times backward; native_logprobs.c reads each row from the cache twice forward and once backward and writes the
gradient straight in the logits' dtype. Its exp is its own (within 2 ulp of torch's), so its log-probs are not
algo.token_logprobs's bits: what must agree bit for bit is this path with itself, the no-gradient pass that gives a
step's old log-probs and the training pass, and it does, one thread computing each row alone. Every path of a run
takes the same choice (`applies`: the dtype, the device and whether the kernel built, never the batch's size), so the
ratio starts at 1 on either path. tests/models/test_native_logprobs.py checks it against float64.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from rlvr.models import native_build

SOURCE = Path(__file__).with_name("native_logprobs.c")
ON = True  # False: algo.token_logprobs's torch ops always (bench/native_logprobs_ab.py's "before")
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
# logits, bf16, s0, s1, N, L, V, index, T, m, log_z, logp, entropy (or None), threads
_FORWARD = (_P, ctypes.c_int, _I, _I, _I, _I, _I, _P, _F, _P, _P, _P, _P, ctypes.c_int)
# logits, bf16, s0, s1, grad, gs0, gs1, N, L, V, index, T, m, log_z, g, gh (or None), entropy (or None), threads
_BACKWARD = (_P, ctypes.c_int, _I, _I, _P, _I, _I, _I, _I, _I, _P, _F, _P, _P, _P, _P, _P, ctypes.c_int)


@functools.cache
def _kernels() -> tuple[Any, Any] | None:
    forward = native_build.function(SOURCE, "rlvr_token_logprobs", _FORWARD)
    backward = native_build.function(SOURCE, "rlvr_token_logprobs_backward", _BACKWARD)
    return None if forward is None or backward is None else (forward, backward)


def available() -> bool:
    """Whether the kernel is built and loaded in this process (native_build.why_not(SOURCE) says why not)."""
    return _kernels() is not None


@functools.cache
def vector_bits() -> int:
    """The kernel build's vector width: 512 (AVX-512), 256 (AVX2), 0 where its loops run split into narrower registers
    (SSE, or another architecture), slower there than torch's ops; 0 where it did not build."""
    fn = native_build.function(SOURCE, "rlvr_token_logprobs_vector_bits", (), ctypes.c_int)
    return 0 if fn is None else int(fn())


def applies(logits: torch.Tensor) -> bool:
    """Whether the training forward takes token_logprobs for these logits [N, L', V]: bf16 or fp32 on the CPU, V
    contiguous, the kernel built with AVX2 or AVX-512 vectors. Nothing about the batch's size: every forward of a run
    (old log-probs, training) takes the same path."""
    return (
        ON
        and logits.device.type == "cpu"
        and logits.dtype in (torch.bfloat16, torch.float32)
        and logits.dim() == 3
        and logits.stride(-1) == 1
        and available()
        and vector_bits() >= 256
    )


def token_logprobs(
    logits: torch.Tensor,  # [N, L', V], L' >= L, bf16 or fp32 on the CPU, V contiguous
    index: torch.Tensor,  # [N, L] the tokens whose log-probs are wanted
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    grad_in_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """algo.token_logprobs's outputs (log-probs [N, L] fp32 and, with_entropy, entropies [N, L] fp32; positions of the
    logits past L get gradient 0; grad_in_logits: the backward writes over the logits) from the C kernels."""
    assert available(), f"the native log-probs kernel did not build: {native_build.why_not(SOURCE)}"
    assert logits.device.type == "cpu" and logits.dtype in (torch.bfloat16, torch.float32) and logits.dim() == 3
    assert logits.stride(-1) == 1, "the logits' vocabulary dimension must be contiguous"
    (N, L), V = index.shape, logits.shape[-1]
    if logits.shape[0] != N or logits.shape[1] < L:
        raise ValueError(f"logits {tuple(logits.shape)} do not cover the index {tuple(index.shape)}")
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= V):
        raise IndexError(f"a token id of the index lies outside the vocabulary [0, {V}) of the logits")
    entropy_grad = entropy_grad and with_entropy
    in_logits = grad_in_logits and logits.is_contiguous()
    logp, entropy = _NativeTokenLogProbs.apply(logits, index, float(temperature), with_entropy, entropy_grad, in_logits)
    return logp, entropy if with_entropy else None


class _NativeTokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, index: torch.Tensor, T: float, with_entropy: bool, entropy_grad: bool, in_logits: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        forward, _ = _kernels()  # type: ignore[misc]
        (N, L), V = index.shape, logits.shape[-1]
        index = index.to(torch.int64).contiguous()
        shift = logits.new_empty(2, N, L, dtype=torch.float32)  # m and log Z per token, for the backward
        m, log_z = shift[0], shift[1]
        logp = torch.empty_like(m)
        entropy = torch.empty_like(m) if with_entropy else m.new_empty(0)
        forward(
            logits.data_ptr(), logits.dtype == torch.bfloat16, logits.stride(0), logits.stride(1), N, L, V, index.data_ptr(), T,
            m.data_ptr(), log_z.data_ptr(), logp.data_ptr(), entropy.data_ptr() if with_entropy else None,
            torch.get_num_threads(),
        )  # fmt: skip
        ctx.save_for_backward(logits, index, m, log_z, entropy if entropy_grad else None)
        ctx.T, ctx.in_logits = T, in_logits
        ctx.set_materialize_grads(False)
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor | None, g_entropy: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        _, backward = _kernels()  # type: ignore[misc]
        logits, index, m, log_z, entropy = ctx.saved_tensors
        (N, L), V, T = index.shape, logits.shape[-1], ctx.T
        g = m.new_zeros(N, L) if g_logp is None else (g_logp.float() / T).contiguous()  # d/dlogits = d/dx / T
        gh = None if entropy is None or g_entropy is None else (g_entropy.float() / T).contiguous()
        grad = logits if ctx.in_logits else logits.new_empty(logits.shape)  # [N, L', V] in the logits' dtype
        grad[:, L:] = 0  # positions past L: read by nothing
        backward(
            logits.data_ptr(), logits.dtype == torch.bfloat16, logits.stride(0), logits.stride(1), grad.data_ptr(),
            grad.stride(0), grad.stride(1), N, L, V, index.data_ptr(), T, m.data_ptr(), log_z.data_ptr(), g.data_ptr(),
            None if gh is None else gh.data_ptr(), None if gh is None else entropy.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        return grad, None, None, None, None, None
