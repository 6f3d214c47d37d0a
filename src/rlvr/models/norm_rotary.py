"""RMSNorm and rotary embedding for the training forward on the CPU, with their backward written out.

Autograd records transformers' RMSNorm as six elementwise ops and its rotary embedding (`x cos + rotate_half(x) sin`,
rotate_half a concatenation of negated slices) as seven, and their backward as more: the slices' backward each
allocates a zero-filled copy of the whole tensor. On the CPU each op is a pass over an activation-sized tensor, and
in a training micro-batch of a 25M Llama these two take about a tenth of the time outside the matmuls. Here each is
one autograd node:

    RMSNorm  y = w x r,  r = (mean(x^2) + eps)^-1/2          forward: the same six ops (aten's own decomposition)
             dx = r (g w - x^ mean(g w x^)),  x^ = x r        backward: five ops instead of about twelve
             dw = sum over rows of g x^
    rotary   y = x cos + roll(x, D/2) sin~                   forward and backward: four ops instead of seven / ten
             dx = g cos + roll(g sin~, D/2)                  (sin~ = sin with its first half negated: roll(x, D/2)
                                                              sin~ is rotate_half(x) sin, product for product)

Both forwards give transformers' bits exactly (fp32); the rotary backward too; the norm's backward is the same math
in another order (within 1e-6 relative of transformers', as close to the fp64 truth: tests/models/test_norm_rotary.py).
bench/results/norm_rotary_intel.md measures them. Where a C compiler is at hand each is one C pass instead: the rotation
both ways with the same bits (native_training_rotary), the norm's forward with aten's bits (native_norm, the decode's
kernel: on the CPU aten's rms_norm is six ops) and its backward over the rows at once (native_training_norm, the same
math again in another order); bench/results/native_training_amx.md and training_copies_amx.md measure them.

Under bf16 autocast the rotation takes the projections' bf16 q and k too (BF16_ROTARY): its forward is transformers'
fp32 output bit for bit, its backward rounds to bf16 once instead of per term (bench/results/bf16_rotary_amx.md: a
training micro-batch 0.96-0.97x).

`fused_norm_and_rotary(model)` swaps them in for the block around the training forward (next to
attention.short_attention_explicit): each plain RMSNorm module's forward, and the rotary function of the model's
modeling module, which transformers looks up by name at each call. Only where the gradient flows, in fp32 (or bf16 q and k), on the
CPU, outside torch.compile and gradient checkpointing (whose recomputation must save what the forward saved); every
other call, in any thread, goes to transformers' own code unchanged.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

import torch

from rlvr.models import native_norm, native_training_norm, native_training_rotary
from rlvr.models.attention import activation_checkpointing
from rlvr.models.forward_swaps import swapped_forwards
from rlvr.models.native_norm import PLAIN_RMS_NORMS

# under bf16 autocast q and k (the projections' bf16 output) rotate through _Rotary too: its forward gives transformers'
# fp32 bits; its backward sums the two terms in fp32 and rounds once to bf16, where autograd rounds each term's gradient
# to bf16 and adds them in bf16 (the same math, one rounding instead of three)
BF16_ROTARY = True
# architectures whose modeling module's apply_rotary_pos_emb is llama's: x cos + rotate_half(x) sin, cos/sin
# unsqueezed at the heads' dimension
HALF_ROTARY = {"llama", "mistral", "qwen2", "qwen3"}


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated: rotate_half(x) x sin == roll(x, D/2) x signed_sin, product for product."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x cos + rotate_half(x) sin with transformers' bits, in four ops: x [.., D], cos / sin_signed broadcast to it."""
    out = x * cos
    return out.add_(x.roll(x.shape[-1] // 2, -1) * sin_signed)  # not in place: x may be bf16 under autocast, sin fp32


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin_signed):  # x [B, H, L, D]; cos, sin_signed [B, 1, L, D]
        ctx.save_for_backward(cos, sin_signed)
        # one C pass each way where it builds (the same bits); the gradient in x's dtype and layout (dense: a view
        # of the projection's output), where autograd would cast torch's fp32 one
        ctx.native = (x.dtype, x.stride()) if native_training_rotary.applies(x, cos) and _dense(x) else None
        return native_training_rotary.rotate(x, cos, sin_signed) if ctx.native else rotate(x, cos, sin_signed)

    @staticmethod
    def backward(ctx, grad):
        cos, sin_signed = ctx.saved_tensors
        if ctx.native:
            return native_training_rotary.unrotate(grad, cos, sin_signed, *ctx.native), None, None
        # the rotation's transpose: d/dx of roll(x) sin~ is roll(g sin~) the other way, which for a half-length roll is the same roll
        return (grad * cos).add_((grad * sin_signed).roll(grad.shape[-1] // 2, -1)), None, None


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps: float):  # x [.., H], weight [H]
        if native_norm.training_applies(x, weight):  # one C pass, aten's bits (six ops on the CPU)
            y, rstd = native_norm.rms_norm_rows(x, weight, eps)
        else:
            y, rstd = torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, eps)  # rstd [.., 1]
        ctx.save_for_backward(x, rstd, weight)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        if native_training_norm.applies(x, weight):  # one C pass over the rows: the same math, another order
            d_x, d_weight = native_training_norm.backward(x, grad, rstd, weight, *ctx.needs_input_grad[:2])
            return d_x, d_weight, None
        H = x.shape[-1]
        x_hat = x * rstd  # the normalised input
        d_weight = torch.linalg.vecdot(grad.reshape(-1, H), x_hat.reshape(-1, H), dim=0) if ctx.needs_input_grad[1] else None
        d_x_hat = grad * weight
        mean = torch.linalg.vecdot(d_x_hat, x_hat, dim=-1).unsqueeze(-1).div_(H)  # [.., 1]
        d_x = torch.addcmul(d_x_hat, x_hat, mean, value=-1).mul_(rstd) if ctx.needs_input_grad[0] else None
        return d_x, d_weight, None


def _dense(x: torch.Tensor) -> bool:
    """Whether x's elements fill its storage span without gaps or overlaps (in some order of its dimensions)."""
    order = sorted(range(x.dim()), key=lambda i: x.stride(i))
    expected = 1
    for i in order:
        if x.shape[i] > 1 and x.stride(i) != expected:
            return False
        expected *= x.shape[i]
    return True


def _rotary_applies(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """q and k in fp32, or (BF16_ROTARY) both bf16, the projections' output under bf16 autocast, whose rotation
    transformers computes in fp32 too (bf16 x fp32 cos); cos and sin fp32, without a gradient."""
    if cos.requires_grad or sin.requires_grad or cos.dtype != torch.float32 or sin.dtype != torch.float32:
        return False
    dtypes = (torch.float32, torch.bfloat16) if BF16_ROTARY else (torch.float32,)
    return q.dtype == k.dtype and _fused_applies(q, k, dtypes=dtypes)


def _fused_applies(*tensors: torch.Tensor, dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> bool:
    return (
        torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and any(t.requires_grad for t in tensors)
        and all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.dtype in dtypes and t.device.type == "cpu" for t in tensors)
    )


def _norm_forward(norm):
    plain = type(norm).forward

    def forward(x):
        if _fused_applies(x, norm.weight):
            return _RMSNorm.apply(x, norm.weight, norm.variance_epsilon)
        return plain(norm, x)

    return forward


def _rotary_function(original):
    last: list = [None, None]  # (sin, its signed copy): the layers of one forward share the same sin

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if not _rotary_applies(q, k, cos, sin) or q.shape[-1] % 2:
            return original(q, k, cos, sin, unsqueeze_dim)
        if last[0] is not sin:
            last[:] = [sin, signed_sin(sin)]
        cos, sin_signed = cos.unsqueeze(unsqueeze_dim), last[1].unsqueeze(unsqueeze_dim)
        return _Rotary.apply(q, cos, sin_signed), _Rotary.apply(k, cos, sin_signed)

    return apply_rotary_pos_emb


@contextlib.contextmanager
def fused_norm_and_rotary(model) -> Iterator[None]:
    """Inside the block the model's plain RMSNorms and (llama-family) rotary embedding run the functions above where
    they apply (module docstring); outside, transformers' own."""
    config = getattr(model, "config", None)
    if config is None or activation_checkpointing(model):
        yield
        return
    norms = [m for m in model.modules() if type(m).__name__ in PLAIN_RMS_NORMS and hasattr(m, "variance_epsilon")]
    attention = next((m for m in model.modules() if hasattr(m, "q_proj") and hasattr(m, "k_proj")), None)
    # the modeling module whose global apply_rotary_pos_emb the attention's forward calls
    modeling: Any = sys.modules.get(type(attention).__module__) if getattr(config, "model_type", None) in HALF_ROTARY else None
    rotary = getattr(modeling, "apply_rotary_pos_emb", None)
    fused_rotary = _rotary_function(rotary) if rotary is not None else None
    if fused_rotary is not None:
        modeling.apply_rotary_pos_emb = fused_rotary
    try:
        with swapped_forwards((norm, _norm_forward(norm)) for norm in norms):
            yield
    finally:
        if fused_rotary is not None and modeling.apply_rotary_pos_emb is fused_rotary:  # not if another block swapped it since
            modeling.apply_rotary_pos_emb = rotary
