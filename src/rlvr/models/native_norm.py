"""RMSNorm as one C pass with torch's bits, where it builds; torch's ops elsewhere. The lean decode's norms: the
residual add, RMSNorm and the cast of its output to bf16 (add_norm); the training forward's RMSNorm with the rstd its
backward keeps (rms_norm_rows, for rlvr.models.norm_rotary._RMSNorm), which aten computes on the CPU as six ops.

native_norm.c sums the squares in the order of torch's CPU sum, so its norm is aten's rms_norm bit for bit (the
module's own forward gives the same bits: PLAIN_RMS_NORMS). That order is torch's implementation, not its contract:
`gives_torchs_bits(H)` runs the kernel against torch once per width in a process and the kernel runs only where they
agree. tests/models/test_native_norm.py checks it against torch's ops.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rlvr.models import native_build
from rlvr.models.native_build import row_stride

# norms whose forward is x * rsqrt(mean(x^2) + eps) * weight in fp32 (aten's rms_norm computes the same bits)
PLAIN_RMS_NORMS = {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}
SOURCE = Path(__file__).with_name("native_norm.c")
_P, _I = ctypes.c_void_p, ctypes.c_int64
# x and its row stride, delta (or None), its row stride, whether it is bf16, the weight, eps, the sum's output (or
# None), y, y's bf16 copy (or None), rstd (or None), n, H, threads
_ARGS = (_P, _I, _P, _I, ctypes.c_int, _P, ctypes.c_float, _P, _P, _P, _P, _I, _I, ctypes.c_int)
CHECK_ROWS = 8  # rows of the once-per-width check
ON = True  # False: torch's add, rms_norm and cast always (the A/B's "before")
TRAINING = True  # False: the training forward's RMSNorm through aten's ops (bench A/Bs)


def rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """The norm module's output for x: `F.rms_norm` for the norms known to compute exactly it in fp32 (without the
    module call and its casts to and from fp32: 7 us less per call on the CPU), else the module."""
    if type(norm).__name__ in PLAIN_RMS_NORMS and x.dtype == torch.float32:
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
    return norm(x)


def add_norm(norm, x: torch.Tensor, delta: torch.Tensor | None, bf16: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """x + delta (x where delta is None), its norm h, and the `casts` of h for the products that read it
    (lean_decode._product): with bf16 (the step's products read bf16 under autocast) h's bf16 copy, made in the same
    pass where the kernel runs: a plain RMSNorm over fp32 rows [n, H] on the CPU whose bits it gives here."""
    if _kernel_takes(norm, x, delta):
        x, h, h16 = add_rms_norm(x, delta, norm.weight, norm.variance_epsilon, bf16)
        return x, h, {} if h16 is None else {torch.bfloat16: h16}
    x = x if delta is None else x + delta
    return x, rms_norm(norm, x), {}


def _kernel_takes(norm, x: torch.Tensor, delta: torch.Tensor | None) -> bool:
    """A plain RMSNorm (fp32 weight) of fp32 rows [n, H] on the CPU, a residual of fp32 or bf16 rows or none, where
    the kernel gives torch's bits for width H."""
    plain = ON and type(norm).__name__ in PLAIN_RMS_NORMS and x.dtype == norm.weight.dtype == torch.float32
    rows = x.device.type == "cpu" and x.dim() == 2
    residual = delta is None or (delta.dim() == 2 and delta.dtype in (torch.float32, torch.bfloat16))
    return plain and rows and residual and gives_torchs_bits(x.shape[-1])


@functools.cache
def _kernel() -> Any:
    return native_build.function(SOURCE, "rlvr_add_rms_norm", _ARGS)


def available() -> bool:
    """Whether the kernel is built and loaded in this process (native_build.why_not(SOURCE) says why not)."""
    return _kernel() is not None


@functools.cache
def gives_torchs_bits(H: int) -> bool:
    """Whether the kernel's norm of width H is torch's bit for bit here: checked once per width on rows of several
    scales (built, and this torch sums in the order the kernel follows)."""
    if not available():
        return False
    g = torch.Generator().manual_seed(H)
    x = torch.randn(CHECK_ROWS, H, generator=g) * torch.logspace(-3, 3, CHECK_ROWS)[:, None]
    delta = torch.randn(CHECK_ROWS, H, generator=g)
    w, eps = torch.randn(H, generator=g), 1e-6
    total, y, y16 = add_rms_norm(x, delta, w, eps, bf16=True)
    want = F.rms_norm(x + delta, (H,), w, eps)
    same = torch.equal(total, x + delta) and torch.equal(y, want) and y16 is not None and torch.equal(y16, want.to(torch.bfloat16))
    y, rstd = rms_norm_rows(x, w, eps)
    want, want_rstd = torch.ops.aten._fused_rms_norm(x, [H], w, eps)
    return same and torch.equal(y, want) and torch.equal(rstd, want_rstd)


def add_rms_norm(
    x: torch.Tensor,  # [n, H] fp32, H contiguous
    delta: torch.Tensor | None,  # [n, H] fp32 or bf16, H contiguous: added to x first
    weight: torch.Tensor,  # [H] fp32
    eps: float,
    bf16: bool,  # also the output in bf16
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(x + delta, or x; its RMSNorm [n, H] fp32; that in bf16, or None): torch's add, rms_norm and cast, the same
    bits where gives_torchs_bits(H)."""
    fn = _kernel()
    assert fn is not None, f"the native norm kernel did not build: {native_build.why_not(SOURCE)}"
    n, H = x.shape
    weight = weight.contiguous()
    assert x.dtype == weight.dtype == torch.float32 and x.stride(1) == 1 and weight.shape == (H,) and x.device.type == "cpu"
    total, delta_ptr, delta_stride = x, None, 0
    if delta is not None:
        assert delta.shape == (n, H) and delta.dtype in (torch.float32, torch.bfloat16) and delta.stride(1) == 1
        total, delta_ptr, delta_stride = torch.empty(n, H), delta.data_ptr(), delta.stride(0)
    y = torch.empty(n, H)
    y16 = torch.empty(n, H, dtype=torch.bfloat16) if bf16 else None
    fn(
        x.data_ptr(), x.stride(0), delta_ptr, delta_stride, delta is not None and delta.dtype == torch.bfloat16,
        weight.data_ptr(), eps, None if delta is None else total.data_ptr(), y.data_ptr(),
        None if y16 is None else y16.data_ptr(), None, n, H, torch.get_num_threads(),
    )  # fmt: skip
    return total, y, y16


def training_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether rms_norm_rows takes x [.., H] and weight [H]: fp32 on the CPU, x's rows a view with H contiguous, where
    the kernel gives torch's bits for width H."""
    return (
        TRAINING
        and x.dtype == weight.dtype == torch.float32
        and x.device.type == weight.device.type == "cpu"
        and x.dim() >= 1
        and weight.shape == (x.shape[-1],)
        and row_stride(x) is not None
        and gives_torchs_bits(x.shape[-1])
    )


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [.., H], rstd [.., 1]) of x [.., H] fp32 (rows a view, H contiguous), weight [H] fp32: aten's
    _fused_rms_norm on the CPU (six ops there) as one pass, the same bits where gives_torchs_bits(H)."""
    fn = _kernel()
    assert fn is not None, f"the native norm kernel did not build: {native_build.why_not(SOURCE)}"
    H = x.shape[-1]
    stride = row_stride(x)
    assert x.dtype == weight.dtype == torch.float32 and stride is not None and weight.shape == (H,) and x.device.type == "cpu"
    weight = weight.contiguous()
    y = torch.empty(x.shape, dtype=torch.float32)
    rstd = torch.empty(*x.shape[:-1], 1, dtype=torch.float32)
    fn(
        x.data_ptr(), stride, None, 0, False, weight.data_ptr(), eps, None, y.data_ptr(), None, rstd.data_ptr(),
        x.numel() // H if H else 0, H, torch.get_num_threads(),
    )  # fmt: skip
    return y, rstd
