"""Several gradients summed in float in one C pass (rlvr.models.native_grad_sum): the bits of torch's widening cast of
the first and in-place adds of the rest, in the order given, for bf16, fp32 and mixed gradients, sizes around the
kernel's chunk and its threading bound, values of very different scales, one thread or several; and shared_cast's
backward goes through it."""

import pytest
import torch

from rlvr.models import native_build, native_grad_sum, shared_cast


def _torchs(grads):
    total = grads[0].to(torch.float32, copy=True)
    for g in grads[1:]:
        total.add_(g)
    return total


@pytest.mark.parametrize("numel", [1, 7, 2047, 2048, 2049, 70_001])
@pytest.mark.parametrize("dtypes", [("bf16",), ("bf16", "bf16"), ("bf16",) * 6, ("fp32", "bf16", "fp32"), ("fp32",) * 3])
def test_the_sum_is_torchs_bits(numel, dtypes):
    assert native_grad_sum.applies([torch.zeros(1)]), native_build.why_not(native_grad_sum.SOURCE)  # CI has a compiler
    g = torch.Generator().manual_seed(numel)
    scales = torch.logspace(-20, 20, numel)  # sums whose terms lie far apart round
    grads = [(torch.randn(numel, generator=g) * scales).to(torch.bfloat16 if d == "bf16" else torch.float32) for d in dtypes]
    got = native_grad_sum.summed(grads)
    assert got.dtype == torch.float32 and torch.equal(got, _torchs(grads))


def test_threads_give_the_same_bits():
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(3, 70_000, generator=g).bfloat16() for _ in range(4)]
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(native_grad_sum.summed(grads))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(outs[0], o) for o in outs[1:]) and outs[0].shape == (3, 70_000)


def test_what_it_takes():
    x = torch.zeros(4, 6)
    assert native_grad_sum.applies([x, x.bfloat16()])
    assert not native_grad_sum.applies([x, x.t()])  # not contiguous
    assert not native_grad_sum.applies([x, torch.zeros(6, 4)])  # two shapes
    assert not native_grad_sum.applies([x.double()])
    assert not native_grad_sum.applies([])


def test_shared_casts_backward_goes_through_it(monkeypatch):
    calls = []
    real = native_grad_sum.summed
    monkeypatch.setattr(native_grad_sum, "summed", lambda grads: calls.append(len(grads)) or real(grads))
    linears = [torch.nn.Linear(16, 8) for _ in range(3)]
    x = torch.randn(5, 16, requires_grad=True) * 2
    x.retain_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = [m(c) for m, c in zip(linears, shared_cast.shared(x, 3, torch.bfloat16))]
    sum(o.float().sum() for o in outs).backward()
    assert calls == [3] and x.grad.dtype == torch.float32
