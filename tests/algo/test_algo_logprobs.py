"""algo.token_logprobs (the eager training forward's fused log-probs and entropy) against the plain ops and fp64."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algo import exp_flushed, selective_log_softmax, token_entropy, token_logprobs
from rlvr.algo.logprobs import chunk_tokens


def _truth(logits: torch.Tensor, index: torch.Tensor, temperature: float, g: torch.Tensor, gh: torch.Tensor | None):
    """log-probs, entropy and d(sum g logp + sum gh H)/dlogits in fp64 through autograd."""
    x = logits.detach().double().requires_grad_()
    logp_all = (x / temperature).log_softmax(-1)
    logp = logp_all.gather(-1, index[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    loss = (g.double() * logp).sum() + ((gh.double() * entropy).sum() if gh is not None else 0)
    loss.backward()
    assert x.grad is not None
    return logp.detach(), entropy.detach(), x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [None, 1, 7, 1000])
@pytest.mark.parametrize("scale", [4, 40])  # 40: rows spanning ~250 nats, whose smallest exps are flushed (exp_flushed)
def test_log_probs_are_selective_log_softmaxs_bits(dtype, chunk, scale):
    torch.manual_seed(0)
    logits = (torch.randn(5, 9, 301) * scale).to(dtype)  # 45 tokens: chunks of 7 leave a remainder, 1000 is one chunk
    index = torch.randint(0, 301, (5, 9))
    logp, entropy = token_logprobs(logits, index, chunk=chunk)
    assert entropy is None and logp.dtype == torch.float32 and logp.shape == (5, 9)
    assert torch.equal(logp, selective_log_softmax(logits, index))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("scale", [5, 40])  # 40: rows spanning ~300 nats (exp_flushed's flush, forward and backward)
def test_values_and_gradients_match_fp64(temperature, entropy_grad, scale):
    torch.manual_seed(1)
    logits = torch.randn(3, 11, 2000) * scale
    index = torch.randint(0, 2000, (3, 11))
    g, gh = torch.randn(3, 11), torch.randn(3, 11)
    x = logits.clone().requires_grad_()
    logp, entropy = token_logprobs(x, index, temperature=temperature, with_entropy=True, entropy_grad=entropy_grad, chunk=8)
    assert entropy is not None and entropy.requires_grad == entropy_grad
    loss = (g * logp).sum() + ((gh * entropy).sum() if entropy_grad else 0)
    loss.backward()
    t_logp, t_entropy, t_grad = _truth(logits, index, temperature, g, gh if entropy_grad else None)
    # wide rows: log-probs down to -400, where fp32's own rounding is 3e-5 (relative 1e-7); the entropy gradient's
    # log p factor reaches 300 there
    torch.testing.assert_close(logp.double(), t_logp, rtol=0 if scale == 5 else 2e-7, atol=5e-6)
    torch.testing.assert_close(entropy.double(), t_entropy, rtol=0, atol=5e-6)
    assert x.grad is not None
    torch.testing.assert_close(x.grad.double(), t_grad, rtol=0, atol=1e-6 if scale == 5 else 5e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_flushing_changes_no_log_prob_or_entropy_bit(temperature, monkeypatch):
    """Rows spanning ~300 nats with exp_flushed and with torch.exp in its place: the same log-probs and entropies bit
    for bit; the gradients differ only where p is below 3.2e-38, by less than 1e-34."""
    from rlvr.algo import logprobs

    runs = []
    for exp in (logprobs.exp_flushed, lambda s, out=None, lowest=None: torch.exp(s, out=out)):
        monkeypatch.setattr(logprobs, "exp_flushed", exp)
        torch.manual_seed(1)
        x = (torch.randn(3, 11, 2000) * 40).requires_grad_()
        index, g, gh = torch.randint(0, 2000, (3, 11)), torch.randn(3, 11), torch.randn(3, 11)
        logp, entropy = token_logprobs(x, index, temperature=temperature, with_entropy=True, entropy_grad=True, chunk=8)
        assert entropy is not None
        ((g * logp).sum() + (gh * entropy).sum()).backward()
        runs.append((logp.detach(), entropy.detach(), x.grad))
    (logp, entropy, grad), (logp_exp, entropy_exp, grad_exp) = runs
    assert torch.equal(logp, logp_exp) and torch.equal(entropy, entropy_exp)
    assert grad is not None and grad_exp is not None
    assert 0 < (grad - grad_exp).abs().max() < 1e-34


def test_entropy_is_closer_to_fp64_than_the_plain_ops_on_a_wide_vocabulary():
    torch.manual_seed(2)
    logits = torch.randn(4, 16, 32000) * 3
    index = torch.randint(0, 32000, (4, 16))
    _, entropy = token_logprobs(logits, index, with_entropy=True)
    assert entropy is not None
    truth = _truth(logits, index, 1.0, torch.zeros(4, 16), None)[1]
    fused_err = (entropy.double() - truth).abs().max().item()
    plain_err = (token_entropy(logits).double() - truth).abs().max().item()
    assert fused_err < 4e-6 and fused_err < plain_err


def test_bf16_logits_get_bf16_gradients_of_the_fp32_math():
    torch.manual_seed(3)
    logits = (torch.randn(2, 6, 500) * 3).to(torch.bfloat16).requires_grad_()
    index = torch.randint(0, 500, (2, 6))
    g = torch.randn(2, 6)
    logp, _ = token_logprobs(logits, index, temperature=0.6, chunk=5)
    (g * logp).sum().backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
    t_logp, _, t_grad = _truth(logits.float(), index, 0.6, g, None)  # the bf16 values, divided by T in fp32
    torch.testing.assert_close(logp.double(), t_logp, rtol=0, atol=5e-6)
    torch.testing.assert_close(logits.grad.double(), t_grad, rtol=2**-8, atol=1e-7)  # bf16 rounding of the fp32 gradient


@pytest.mark.parametrize("chunk", [4, 7, 100])
def test_positions_past_the_index_get_no_gradient_and_unused_outputs_none(chunk):
    """logits [N, L + 1, V] as a forward's logits_to_keep = C + 1 gives them: the last position scores nothing."""
    torch.manual_seed(4)
    logits = torch.randn(3, 8, 50, requires_grad=True)
    index = torch.randint(0, 50, (3, 7))
    logp, entropy = token_logprobs(logits, index, with_entropy=True, chunk=chunk)
    assert entropy is not None and not entropy.requires_grad
    assert torch.equal(logp, selective_log_softmax(logits[:, :7], index))
    logp.sum().backward()  # the entropy unused
    assert logits.grad is not None and torch.equal(logits.grad[:, -1], torch.zeros(3, 50))
    t_grad = _truth(logits[:, :7], index, 1.0, torch.ones(3, 7), None)[2]
    torch.testing.assert_close(logits.grad[:, :-1].double(), t_grad, rtol=0, atol=1e-6)
    with torch.no_grad():
        again, none = token_logprobs(logits, index, chunk=chunk)
    assert torch.equal(again, logp.detach()) and none is None


def test_non_contiguous_logits():
    torch.manual_seed(5)
    base = torch.randn(40, 6, 3, requires_grad=True)
    logits = base.permute(2, 1, 0)  # [3, 6, 40], the vocabulary dim strided
    index = torch.randint(0, 40, (3, 6))
    logp, _ = token_logprobs(logits, index, temperature=1.3, chunk=5)
    (logp * torch.arange(6.0)).sum().backward()
    t_logp, _, t_grad = _truth(logits, index, 1.3, torch.arange(6.0).expand(3, 6), None)
    torch.testing.assert_close(logp.double(), t_logp, rtol=0, atol=2e-6)
    assert base.grad is not None
    torch.testing.assert_close(base.grad.permute(2, 1, 0).double(), t_grad, rtol=0, atol=1e-6)


def test_chunks_hold_a_few_megabytes():
    assert chunk_tokens(32000) == 32 and chunk_tokens(151936) == 8 and chunk_tokens(103) == (4 << 20) // 412


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.float16])
@pytest.mark.parametrize("way", ["new", "out", "in place", "input clamped"])
def test_exp_flushed_is_exps_bits_above_the_cut_and_zero_at_and_below(dtype, way):
    """Above log(tiny) + 1 exactly torch.exp's bits; at and below it (subnormal and underflowing results, -inf) 0;
    a NaN stays NaN; inputs with nothing that low go to torch.exp as they are. fp16 (whose exp is fp32's, rounded)
    by fp32's tiny: its own would flush exps up to 1.7e-4. clamp_in_place: the same result, the input clamped at the
    cut as clamp_min clamps it."""
    cut = math.log(torch.finfo(torch.promote_types(dtype, torch.float32)).tiny) + 1.0
    torch.manual_seed(3)
    s = torch.cat([torch.linspace(3 * cut, 0, 4001), torch.tensor([cut, -math.inf, -1e30, 0.0])]).to(dtype)
    s = s[torch.randperm(len(s))].view(5, -1)
    ref = torch.exp(s)
    x = s.clone()
    out = {"new": None, "out": torch.empty_like(x), "in place": x, "input clamped": None}[way]
    got = exp_flushed(x, out=out, clamp_in_place=way == "input clamped")
    assert out is None or got is out
    if way == "input clamped":
        assert torch.equal(x, s.clamp_min(cut)) and not torch.equal(x, s)
    else:
        assert way == "in place" or torch.equal(x, s)  # the input untouched unless it is `out`
    above = s > cut
    assert 0 < int(above.sum()) < s.numel()
    assert torch.equal(got[above], ref[above])
    assert bool((got[~above] == 0).all())
    for bound in (float(s.min()), float(s.min()) - 10):  # the caller's own least value, or a bound below it: the same
        assert torch.equal(exp_flushed(s.clone(), lowest=bound), exp_flushed(s.clone()))
    narrow = s.clamp_min(cut / 2)  # nothing near the cut: torch.exp
    assert torch.equal(exp_flushed(narrow), torch.exp(narrow))
    with_nan = s.clone()
    with_nan[0, 0] = math.nan
    flushed_nan = exp_flushed(with_nan)
    assert torch.isnan(flushed_nan[0, 0]) and torch.equal(flushed_nan.view(-1)[1:], torch.exp(with_nan).view(-1)[1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("chunk", [3, 8, 100])
def test_the_gradient_written_over_the_logits_has_the_new_tensors_bits(dtype, temperature, entropy_grad, chunk):
    """grad_in_logits: the same gradient bit for bit, in the logits' own storage (a forward's output, as the
    training forward's: logits_to_keep = C + 1, the last position scoring nothing)."""
    torch.manual_seed(6)
    weight = torch.randn(300, 16, requires_grad=True)
    hidden, index = torch.randn(4, 8, 16) * 3, torch.randint(0, 300, (4, 7))
    g, gh = torch.randn(4, 7), torch.randn(4, 7)
    grads, storages = [], []
    for in_logits in (False, True):
        logits = (hidden @ weight.T).to(dtype)  # [4, 8, 300]
        logp, entropy = token_logprobs(
            logits, index, temperature=temperature, with_entropy=True, entropy_grad=entropy_grad, chunk=chunk, grad_in_logits=in_logits
        )
        assert entropy is not None
        loss = (g * logp).sum() + ((gh * entropy).sum() if entropy_grad else 0)
        (grad,) = torch.autograd.grad(loss, logits)
        grads.append(grad)
        storages.append(grad.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr())
    assert torch.equal(grads[0], grads[1]) and storages == [False, True]
    assert torch.equal(grads[1][:, -1], torch.zeros(4, 300, dtype=dtype))


def test_logits_another_node_saved_are_not_overwritten_silently():
    """A tensor that saved the logits for its own backward fails autograd's in-place check rather than reading the
    gradient that was written over them."""
    torch.manual_seed(7)
    x = torch.randn(2, 5, 40, requires_grad=True)
    logits = x * 1.0
    index = torch.randint(0, 40, (2, 4))
    square = logits * logits  # saved the logits; its backward runs after the log-probs' (it was made before)
    logp, _ = token_logprobs(logits, index, grad_in_logits=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (logp.sum() + square.sum()).backward()


def test_logits_that_are_not_contiguous_get_a_new_gradient_tensor():
    """A group's one prompt row repeated as an expanded view (several rows on one memory location): written over, it
    would hold one row's gradient for all; grad_in_logits leaves it alone."""
    torch.manual_seed(8)
    head = torch.randn(1, 1, 60, requires_grad=True)
    index, g = torch.randint(0, 60, (4, 1)), torch.randn(4, 1)
    grads = []
    for in_logits in (False, True):
        logp, _ = token_logprobs(head.expand(4, 1, 60), index, grad_in_logits=in_logits)
        grads.append(torch.autograd.grad((g * logp).sum(), head)[0])
    assert torch.equal(grads[0], grads[1])
