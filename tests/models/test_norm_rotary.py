"""The training forward's RMSNorm and rotary functions (rlvr.models.norm_rotary) against transformers': the same
forward bits in fp32, the rotary's backward bits too, the norm's backward as close to the fp64 truth as transformers'
own; through a real Llama's and Qwen3's completion log-probs the same bits and gradients within rounding; and used only
where they are meant to be."""

import contextlib

import pytest
import torch
from transformers.models.llama import modeling_llama
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from _tiny_lms import completion_batch, tiny_lm

from rlvr.models import norm_rotary
from rlvr.models.forward import completion_logprobs
from rlvr.models.norm_rotary import fused_norm_and_rotary


def _rms_fp64(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("shape", [(1, 1, 8), (3, 7, 40), (4, 33, 320), (2, 5, 6, 64)])
def test_rms_norm_forward_bits_and_gradient(shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(*shape, generator=g) * torch.rand(*shape[:-1], 1, generator=g) * 8).requires_grad_()
    norm = LlamaRMSNorm(shape[-1], eps=1e-5)
    norm.weight.data = torch.rand(shape[-1], generator=g) + 0.5
    grad = torch.randn(*shape, generator=g)
    theirs = norm(x)
    theirs_dx, theirs_dw = torch.autograd.grad(theirs, (x, norm.weight), grad)
    ours = norm_rotary._RMSNorm.apply(x, norm.weight, 1e-5)
    ours_dx, ours_dw = torch.autograd.grad(ours, (x, norm.weight), grad)
    assert torch.equal(ours, theirs)
    x64, w64 = x.detach().double().requires_grad_(), norm.weight.detach().double().requires_grad_()
    truth_dx, truth_dw = torch.autograd.grad(_rms_fp64(x64, w64, 1e-5), (x64, w64), grad.double())
    for o, t, truth in ((ours_dx, theirs_dx, truth_dx), (ours_dw, theirs_dw, truth_dw)):
        scale = truth.abs().max().item()
        # as close to the truth as transformers' own fp32 backward (both a few ulps of the largest entry)
        assert (o.double() - truth).abs().max().item() <= max(2 * (t.double() - truth).abs().max().item(), 4e-7 * scale)
        torch.testing.assert_close(o, t, rtol=0, atol=1e-6 * scale)


def test_rms_norm_weight_without_gradient():
    x = torch.randn(4, 16, requires_grad=True)
    w = torch.rand(16) + 0.5
    (dx,) = torch.autograd.grad(norm_rotary._RMSNorm.apply(x, w, 1e-6).sum(), (x,))
    x64 = x.detach().double().requires_grad_()
    (truth,) = torch.autograd.grad(_rms_fp64(x64, w.double(), 1e-6).sum(), (x64,))
    torch.testing.assert_close(dx.double(), truth, rtol=0, atol=1e-6)


@pytest.mark.parametrize("B,H,Hkv,L,D", [(2, 4, 4, 5, 8), (3, 8, 2, 7, 40), (2, 6, 2, 9, 64)])
def test_rotary_forward_and_backward_bits(B, H, Hkv, L, D):
    g = torch.Generator().manual_seed(D)
    # transformers' layout: the projections' [B, L, H, D] seen as [B, H, L, D]
    q = torch.randn(B, L, H, D, generator=g).transpose(1, 2).requires_grad_()
    k = torch.randn(B, L, Hkv, D, generator=g).transpose(1, 2).requires_grad_()
    angles = torch.rand(B, L, D // 2, generator=g) * 50
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos(), angles.sin()
    gq, gk = torch.randn(B, H, L, D, generator=g), torch.randn(B, Hkv, L, D, generator=g)
    theirs = apply_rotary_pos_emb(q, k, cos, sin)
    fused = norm_rotary._rotary_function(apply_rotary_pos_emb)
    ours = fused(q, k, cos, sin)
    for o, t in zip(ours, theirs):
        assert torch.equal(o, t)
    for o, t in zip(torch.autograd.grad(ours, (q, k), (gq, gk)), torch.autograd.grad(theirs, (q, k), (gq, gk))):
        assert torch.equal(o, t)
    # no gradient: transformers' own function runs
    with torch.no_grad():
        assert all(torch.equal(o, t) for o, t in zip(fused(q, k, cos, sin), theirs))


@pytest.mark.parametrize("B,H,Hkv,L,D", [(2, 4, 4, 5, 8), (3, 8, 2, 7, 64)])
def test_rotary_of_bf16_projections_under_autocast(B, H, Hkv, L, D):
    """q and k in bf16 (the projections' output under bf16 autocast), cos and sin fp32: the forward is transformers'
    fp32 output bit for bit; the backward rounds the fp32 sum of both terms to bf16 once, where transformers' rounds
    each term and adds in bf16: within one bf16 rounding of theirs, and nearer the float64 gradient."""
    g = torch.Generator().manual_seed(D)
    q = torch.randn(B, L, H, D, generator=g).bfloat16().transpose(1, 2).requires_grad_()
    k = torch.randn(B, L, Hkv, D, generator=g).bfloat16().transpose(1, 2).requires_grad_()
    angles = torch.rand(B, L, D // 2, generator=g) * 50
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos(), angles.sin()
    gq, gk = torch.randn(B, H, L, D, generator=g), torch.randn(B, Hkv, L, D, generator=g)
    theirs = apply_rotary_pos_emb(q, k, cos, sin)
    ours = norm_rotary._rotary_function(apply_rotary_pos_emb)(q, k, cos, sin)
    assert all(o.dtype == torch.float32 and torch.equal(o, t) for o, t in zip(ours, theirs))
    ours_grad = torch.autograd.grad(ours, (q, k), (gq, gk))
    theirs_grad = torch.autograd.grad(theirs, (q, k), (gq, gk))
    qd, kd = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    truth = torch.autograd.grad(apply_rotary_pos_emb(qd, kd, cos.double(), sin.double()), (qd, kd), (gq.double(), gk.double()))
    for o, t, exact in zip(ours_grad, theirs_grad, truth):
        assert o.dtype == t.dtype == torch.bfloat16
        torch.testing.assert_close(o.float(), t.float(), rtol=2**-7, atol=2**-7 * float(t.abs().max()))
        assert (o.double() - exact).abs().mean() < (t.double() - exact).abs().mean()


def _model(kind: str):
    return tiny_lm("qwen3", seed=1, num_attention_heads=4, head_dim=16) if kind == "qwen3" else tiny_lm("llama")


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("grouped", [False, True])
def test_training_forward_same_logprobs_and_gradients(kind, grouped, monkeypatch):
    model = _model(kind)
    prompt, prompt_mask, completion, completion_mask = completion_batch()
    groups = torch.tensor([0, 0, 0, 1, 1, 1]) if grouped else None
    if grouped:
        prompt, prompt_mask = prompt[[0, 0, 0, 3, 3, 3]], prompt_mask[[0, 0, 0, 3, 3, 3]]
    calls = {"norm": 0, "rotary": 0}

    def counted(name, apply):
        def counting(*args):
            calls[name] += 1
            return apply(*args)

        return counting

    monkeypatch.setattr(norm_rotary._RMSNorm, "apply", counted("norm", norm_rotary._RMSNorm.apply))
    monkeypatch.setattr(norm_rotary._Rotary, "apply", counted("rotary", norm_rotary._Rotary.apply))
    runs = []
    for fused in (True, False):
        model.zero_grad()
        if not fused:
            monkeypatch.setattr("rlvr.models.forward.fused_norm_and_rotary", lambda model: contextlib.nullcontext())
        out = completion_logprobs(model, prompt, prompt_mask, completion, completion_mask, group_ids=groups)
        (out.logp * completion_mask).sum().backward()
        runs.append((out.logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        if fused:
            layers = model.config.num_hidden_layers
            norms = 2 * layers + 1 + (2 * layers if hasattr(model.model.layers[0].self_attn, "q_norm") else 0)
            passes = 2 if grouped else 1  # the shared-prefix forward runs the prompts, then the completions
            assert calls == {"norm": norms * passes, "rotary": 2 * layers * passes}
    (lp_fused, g_fused), (lp_plain, g_plain) = runs
    assert torch.equal(lp_fused, lp_plain)  # the forward's bits
    for name, grad in g_plain.items():  # measured within 5e-7 of the largest entry
        torch.testing.assert_close(g_fused[name], grad, rtol=0, atol=2e-6 * grad.abs().max().item(), msg=name)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_training_forward_under_bf16_autocast(kind, monkeypatch):
    """Under bf16 autocast the norms and the rotation of the bf16 q and k run fused too: the same log-probs bit for bit,
    the gradients within bf16 rounding of transformers' (the rotation's backward rounds once instead of per term)."""
    model = _model(kind)
    prompt, prompt_mask, completion, completion_mask = completion_batch()
    rotations = []
    apply = norm_rotary._Rotary.apply
    monkeypatch.setattr(norm_rotary._Rotary, "apply", lambda x, *a: rotations.append(x.dtype) or apply(x, *a))
    runs = []
    for fused in (True, False):
        model.zero_grad()
        if not fused:
            monkeypatch.setattr("rlvr.models.forward.fused_norm_and_rotary", lambda model: contextlib.nullcontext())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = completion_logprobs(model, prompt, prompt_mask, completion, completion_mask)
        (out.logp * completion_mask).sum().backward()
        runs.append((out.logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        if fused:  # llama rotates the projections' bf16 output; qwen3 its per-head norms' fp32 output
            assert rotations and set(rotations) == {torch.float32 if kind == "qwen3" else torch.bfloat16}
    (lp_fused, g_fused), (lp_plain, g_plain) = runs
    assert torch.equal(lp_fused, lp_plain)
    for name, grad in g_plain.items():
        torch.testing.assert_close(g_fused[name], grad, rtol=0, atol=2e-2 * grad.abs().max().item(), msg=name)


def test_block_restores_transformers_functions_and_skips_what_it_should():
    model = tiny_lm("llama")
    norm = model.model.layers[0].input_layernorm
    rotary = modeling_llama.apply_rotary_pos_emb
    x = torch.randn(2, 3, 48)
    with fused_norm_and_rotary(model):
        assert "forward" in norm.__dict__ and modeling_llama.apply_rotary_pos_emb is not rotary
        with torch.no_grad():  # no gradient: transformers' own forward, the same bits
            assert torch.equal(norm(x), type(norm).forward(norm, x))
        assert torch.equal(norm(x.double()), type(norm).forward(norm, x.double()))  # not fp32: transformers' own
    assert "forward" not in norm.__dict__ and modeling_llama.apply_rotary_pos_emb is rotary
    with fused_norm_and_rotary(model):  # nested blocks: the inner one leaves the outer one's functions behind it
        outer_norm, outer_rotary = norm.__dict__["forward"], modeling_llama.apply_rotary_pos_emb
        with fused_norm_and_rotary(model):
            pass
        assert norm.__dict__["forward"] is outer_norm and modeling_llama.apply_rotary_pos_emb is outer_rotary
    assert "forward" not in norm.__dict__ and modeling_llama.apply_rotary_pos_emb is rotary
    model.activation_checkpointing_enable()
    with fused_norm_and_rotary(model):  # the recomputation runs outside the block: nothing swapped
        assert "forward" not in norm.__dict__ and modeling_llama.apply_rotary_pos_emb is rotary


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rotate_is_transformers_rotation_bit_for_bit(dtype):
    """The decode's rotation (lean_decode): x of the projections' dtype (bf16 under autocast), cos/sin in fp32."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(9, 6, 32, generator=g).to(dtype)
    angles = torch.rand(9, 1, 16, generator=g) * 80
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos(), angles.sin()
    theirs = (x * cos) + (modeling_llama.rotate_half(x) * sin)
    ours = norm_rotary.rotate(x, cos, norm_rotary.signed_sin(sin))
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,cos_rows,H,L,D", [(2, 2, 4, 5, 6), (3, 1, 8, 7, 64), (2, 2, 3, 9, 96), (1, 1, 2, 33, 128)])
def test_native_rotary_pass_gives_torchs_bits(dtype, B, cos_rows, H, L, D, monkeypatch):
    """_Rotary through its C pass (native_training_rotary) against its torch ops: the forward's fp32 output and the
    backward's gradient (in the input's dtype and layout, what autograd makes of torch's fp32 one) bit for bit, for
    fp32 and bf16 projections, a cos per row or one for all, heads of 6 to 128 (some values inf and NaN)."""
    from rlvr.models import native_training_rotary

    g = torch.Generator().manual_seed(D + B)
    x = (torch.randn(B, L, H, D, generator=g) * 30).to(dtype)
    x[0, 0, 0, :2] = torch.tensor([float("inf"), float("nan")])
    angles = torch.rand(cos_rows, L, D // 2, generator=g) * 50
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos().unsqueeze(1), norm_rotary.signed_sin(angles.sin()).unsqueeze(1)
    grad = torch.randn(B, H, L, D, generator=g) * 1e3
    grad[-1, -1, -1, -1] = float("nan")
    results = []
    for on in (True, False):
        monkeypatch.setattr(native_training_rotary, "ON", on)
        xv = x.clone().transpose(1, 2).requires_grad_()  # the projection's [B, L, H, D] seen as [B, H, L, D]
        assert native_training_rotary.applies(xv, cos) == on
        y = norm_rotary._Rotary.apply(xv, cos, sin)
        (dx,) = torch.autograd.grad(y, (xv,), grad)
        results.append((y, dx))
    (y, dx), (y_torch, dx_torch) = results
    assert y.dtype == torch.float32 and y.is_contiguous() and torch.equal(y.nan_to_num(), y_torch.nan_to_num())
    assert torch.equal(y.isnan(), y_torch.isnan())
    assert dx.dtype == dtype and dx.stride() == x.transpose(1, 2).stride()
    assert torch.equal(dx.float().nan_to_num(), dx_torch.float().nan_to_num()) and torch.equal(dx.isnan(), dx_torch.isnan())


def test_native_rotary_leaves_what_it_cannot_take_to_torch():
    from rlvr.models import native_training_rotary

    cos = torch.ones(1, 1, 4, 8)
    assert native_training_rotary.applies(torch.ones(2, 3, 4, 8), cos)
    assert not native_training_rotary.applies(torch.ones(2, 3, 4, 8).double(), cos)  # fp64
    assert not native_training_rotary.applies(torch.ones(2, 3, 4, 7), torch.ones(1, 1, 4, 7))  # odd head
    assert not native_training_rotary.applies(torch.ones(2, 3, 8, 4).transpose(-1, -2), cos)  # D strided
    assert not native_training_rotary.applies(torch.ones(2, 3, 4, 8), cos.half())
    assert not native_training_rotary.applies(torch.ones(2, 3, 4, 8), torch.ones(1, 3, 4, 8))  # cos per head


@pytest.mark.parametrize("shape, threads", [((3, 5, 20), 1), ((64, 64, 512), 3), ((1000, 8), 2), ((2, 300, 96), 2)])
def test_native_norm_backward_as_near_the_truth_as_torchs(shape, threads, monkeypatch):
    """_RMSNorm's backward through its C pass (native_training_norm) against its torch path: both gradients within
    float rounding of each other and as near the float64 gradient, at several thread counts (the weight's gradient
    summed per thread) and widths no vector divides; the input a strided view of a wider tensor."""
    from rlvr.models import native_training_norm

    g = torch.Generator().manual_seed(shape[-1] + threads)
    wide = torch.randn(*shape[:-1], shape[-1] + 3, generator=g) * torch.rand(*shape[:-1], 1, generator=g) * 8
    x = wide[..., 1 : shape[-1] + 1]  # rows strided
    w = torch.rand(shape[-1], generator=g) + 0.5
    grad = torch.randn(*shape, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results = []
        for on in (True, False):
            monkeypatch.setattr(native_training_norm, "ON", on)
            leaf, wv = wide.clone().requires_grad_(), w.clone().requires_grad_()
            xv = leaf[..., 1 : shape[-1] + 1]
            assert native_training_norm.applies(xv, wv) == on and xv.stride(-2) == shape[-1] + 3
            d_leaf, d_w = torch.autograd.grad(norm_rotary._RMSNorm.apply(xv, wv, 1e-6), (leaf, wv), grad)
            results.append((d_leaf[..., 1 : shape[-1] + 1], d_w))
    finally:
        torch.set_num_threads(before)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    truth = torch.autograd.grad(_rms_fp64(x64, w64, 1e-6), (x64, w64), grad.double())
    for native, plain, exact in zip(*results, truth):
        scale = exact.abs().max().item()
        err_native, err_plain = ((t.double() - exact).abs().max().item() for t in (native, plain))
        assert err_native <= max(2 * err_plain, 4e-7 * scale), (err_native, err_plain, scale)
        torch.testing.assert_close(native, plain, rtol=0, atol=2e-6 * scale)
