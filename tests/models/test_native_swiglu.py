"""The MLP's bf16 SwiGLU as one C pass each way (rlvr.models.native_swiglu): for every bf16 gate value the forward
and both gradients bit for bit as torch's silu, mul and their backward; through a real Llama's and Qwen2's training
forward under bf16 autocast the same log-probs and gradients bit for bit; used only where it applies."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

from _tiny_lms import completion_batch, tiny_lm

from rlvr.models import native_build, native_swiglu
from rlvr.models.forward import completion_logprobs

EVERY = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)  # every bf16 value, NaNs and infs too


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bits where not NaN, NaN at the same places (torch's scalar and vector paths write NaNs of other bits)."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num().view(torch.int16), b.nan_to_num().view(torch.int16))


def test_kernel_builds_here():
    assert native_swiglu._kernels() is not None, native_build.why_not(native_swiglu.SOURCE)  # a compiler: CI's machines have one


@pytest.mark.parametrize("scale", [1.0, 1e-3, 3e4])
def test_every_gate_value_forward_and_backward_bits(scale):
    g = torch.Generator().manual_seed(int(scale * 7))
    gate = EVERY.reshape(256, 256)
    up = (torch.randn(256, 256, generator=g) * scale).bfloat16()
    grad = (torch.randn(256, 256, generator=g) * scale).bfloat16()
    gate_t, up_t = gate.clone().requires_grad_(), up.clone().requires_grad_()
    theirs = F.silu(gate_t) * up_t
    theirs_grads = torch.autograd.grad(theirs, (gate_t, up_t), grad)
    gate_o, up_o = gate.clone().requires_grad_(), up.clone().requires_grad_()
    ours = native_swiglu.swiglu(torch.nn.SiLU(), gate_o, up_o)
    assert ours.grad_fn is not None and type(ours.grad_fn).__name__ == "SwiGLUBackward"
    ours_grads = torch.autograd.grad(ours, (gate_o, up_o), grad)
    assert _same_bits(ours, theirs)
    for o, t in zip(ours_grads, theirs_grads):
        assert o.dtype == torch.bfloat16 and _same_bits(o, t)


def test_strided_halves_of_a_fused_product_and_odd_sizes():
    """gate and up as the two halves of one [rows, 2 I] product (the decode's fused gate/up), sizes no vector divides."""
    g = torch.Generator().manual_seed(5)
    for rows, I in ((1, 1), (3, 7), (5, 33), (64, 1376)):
        both = torch.randn(rows, 2 * I, generator=g).mul(4).bfloat16()
        gate, up = both.chunk(2, -1)
        with torch.inference_mode():
            assert native_swiglu.applies(torch.nn.SiLU(), gate, up)
            assert _same_bits(native_swiglu.swiglu(torch.nn.SiLU(), gate, up), F.silu(gate) * up)
        x = torch.randn(2, rows, I, generator=g).bfloat16()
        assert _same_bits(native_swiglu.swiglu(torch.nn.SiLU(), x, x), F.silu(x) * x)


def test_applies_only_where_it_computes_the_same():
    silu, x = torch.nn.SiLU(), torch.randn(4, 8).bfloat16()
    assert native_swiglu.applies(silu, x, x)
    assert not native_swiglu.applies(torch.nn.GELU(), x, x)
    assert not native_swiglu.applies(silu, x.float(), x.float())  # fp32: 2^32 values, no table
    assert not native_swiglu.applies(silu, x, x.float())
    assert not native_swiglu.applies(silu, x.t(), x.t())  # the intermediate strided
    assert not native_swiglu.applies(silu, x, x[:, :4].repeat(1, 2)[:2])  # shapes differ
    y = torch.randn(4, 8)
    assert torch.equal(native_swiglu.swiglu(torch.nn.GELU(), y, y), F.gelu(y) * y)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_training_forward_same_logprobs_and_gradients(kind, monkeypatch):
    """Under bf16 autocast every MLP's SwiGLU runs through SwiGLU (counted), the log-probs and every parameter's
    gradient bit for bit as transformers' MLP; in fp32 it stays transformers'."""
    model = tiny_lm("qwen2", seed=1, hidden_size=32, intermediate_size=72, num_attention_heads=4) if kind == "qwen2" else tiny_lm()
    prompt, prompt_mask, completion, completion_mask = completion_batch()
    calls = []
    apply = native_swiglu.SwiGLU.apply
    monkeypatch.setattr(native_swiglu.SwiGLU, "apply", lambda *a: calls.append(1) or apply(*a))
    runs = []
    for native in (True, False):
        model.zero_grad()
        if not native:
            monkeypatch.setattr("rlvr.models.forward.swiglu_mlps", lambda model: contextlib.nullcontext())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = completion_logprobs(model, prompt, prompt_mask, completion, completion_mask)
        (out.logp * completion_mask).sum().backward()
        runs.append((out.logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        assert len(calls) == (2 if native else 0)  # one per layer
        calls.clear()
    (lp_native, g_native), (lp_torch, g_torch) = runs
    assert torch.equal(lp_native, lp_torch)
    for name, grad in g_torch.items():
        assert torch.equal(g_native[name], grad), name
    monkeypatch.undo()
    completion_logprobs(model, prompt, prompt_mask, completion, completion_mask).logp.sum().backward()  # fp32
    assert not calls
    assert all("forward" not in m.__dict__ for m in model.modules())  # the block put transformers' forward back
