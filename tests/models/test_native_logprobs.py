"""The C pass for the training forward's log-probs and entropies (rlvr.models.native_logprobs) against float64 and
against algo.token_logprobs's torch ops: bf16 and fp32 logits, temperatures, an entropy with and without its gradient,
vocabularies that leave a partial last vector, strided and repeated rows; the same bits for a row whatever the batch
and the thread count (so old and new log-probs agree and the ratio starts at 1); the gradient written over the
logits; rows spanning hundreds of nats, masked (-inf) tokens and NaN; and the training forward taking it."""

import pytest
import torch

import rlvr.models.native_logprobs as native_logprobs
from rlvr.algo import token_logprobs
from rlvr.models import native_build
from rlvr.models.forward import completion_logprobs

from _tiny_lms import completion_batch, tiny_lm


def setup_module():
    assert native_logprobs.available(), native_build.why_not(native_logprobs.SOURCE)  # a compiler: CI's machines have one


def _logits(N, L, V, dtype, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, L + 1, V, generator=g) * scale).to(dtype), torch.randint(0, V, (N, L), generator=g)


def _truth(logits, index, T, w, wh):
    """float64 log-probs, entropies and the gradient of sum(w logp + wh H) to the logits (positions past L: 0)."""
    x = logits.detach().double().requires_grad_()
    L = index.shape[1]
    logp_all = (x[:, :L] / T).log_softmax(-1)
    logp = logp_all.gather(-1, index[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    (w.double() * logp + (0 if wh is None else wh.double() * entropy)).sum().backward()
    return logp.detach(), entropy.detach(), x.grad


def _run(fn, logits, index, T, w, wh, **kw):
    x = logits.detach().clone().requires_grad_()
    logp, entropy = fn(x, index, temperature=T, with_entropy=True, entropy_grad=wh is not None, **kw)
    (w * logp + (0 if wh is None else wh * entropy)).sum().backward()
    return logp.detach(), entropy.detach(), x.grad


@pytest.mark.parametrize("V", [7, 61, 1037, 32000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T, entropy_grad", [(1.0, False), (0.7, False), (0.7, True), (1.3, True)])
def test_matches_float64_as_closely_as_torchs_ops(V, dtype, T, entropy_grad):
    logits, index = _logits(5, 6, V, dtype, seed=V)
    g = torch.Generator().manual_seed(1)
    w, wh = torch.randn(5, 6, generator=g), torch.randn(5, 6, generator=g) if entropy_grad else None
    logp_64, entropy_64, grad_64 = _truth(logits, index, T, w, wh)
    logp, entropy, grad = _run(native_logprobs.token_logprobs, logits, index, T, w, wh)
    t_logp, t_entropy, t_grad = _run(token_logprobs, logits, index, T, w, wh)
    assert logp.dtype == entropy.dtype == torch.float32 and grad.dtype == dtype
    # the kernel's error against float64 at most torch's ops' plus a few float roundings at the values' size
    for ours, theirs, truth in ((logp, t_logp, logp_64), (entropy, t_entropy, entropy_64)):
        slack = 4e-7 * (truth.abs().max().item() + 1)
        assert (ours.double() - truth).abs().max() <= (theirs.double() - truth).abs().max() + slack
    assert (grad[:, 6:] == 0).all()  # the position past the completion
    # every gradient entry within one rounding of the logits' dtype (and a few fp32 ones) of float64's
    ulp = torch.finfo(dtype).eps
    tolerance = grad_64.abs() * ulp + 1e-6 * grad_64.abs().max()
    assert ((grad.double() - grad_64).abs() <= tolerance).all()
    assert (grad.double() - grad_64).abs().max() <= 2 * (t_grad.double() - grad_64).abs().max() + 1e-7


def test_a_row_gives_the_same_bits_in_any_batch_and_thread_count():
    """Old log-probs (no gradient, any micro-batch) and the training pass's: bit for bit, so the ratio starts at 1."""
    logits, index = _logits(6, 9, 3001, torch.bfloat16, seed=4)
    whole = native_logprobs.token_logprobs(logits, index, temperature=0.8, with_entropy=True)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            with torch.no_grad():
                for r in range(6):
                    one = native_logprobs.token_logprobs(logits[r : r + 1, :4], index[r : r + 1, :4], temperature=0.8, with_entropy=True)
                    assert torch.equal(one[0], whole[0][r : r + 1, :4]) and torch.equal(one[1], whole[1][r : r + 1, :4])
    finally:
        torch.set_num_threads(threads)
    x = logits.clone().requires_grad_()
    trained = native_logprobs.token_logprobs(x, index, temperature=0.8, with_entropy=True, entropy_grad=True)
    assert torch.equal(trained[0].detach(), whole[0]) and torch.equal(trained[1].detach(), whole[1])


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_the_gradient_written_over_the_logits_is_the_same(entropy_grad):
    logits, index = _logits(3, 5, 517, torch.bfloat16, seed=2)
    w, wh = torch.randn(3, 5), torch.randn(3, 5)
    outs = []
    for in_logits in (False, True):
        x = logits.clone().requires_grad_()
        y = x * 1  # the forward's own output, as the training forward's logits
        logp, entropy = native_logprobs.token_logprobs(y, index, with_entropy=True, entropy_grad=entropy_grad, grad_in_logits=in_logits)
        assert entropy is not None
        (grad,) = torch.autograd.grad((w * logp + wh * entropy).sum(), y)
        assert (grad.data_ptr() == y.data_ptr()) == in_logits
        outs.append(grad)
    assert torch.equal(outs[0], outs[1])


def test_strided_and_repeated_rows():
    """A slice of wider rows and a row repeated by expand (stride 0): the values of the same rows made contiguous."""
    wide, index = _logits(4, 3, 300, torch.float32, seed=5)
    strided = wide[:, :, :257]
    index = index.clamp(max=256)
    for x in (strided, strided[:1].expand(4, -1, -1)):
        a = native_logprobs.token_logprobs(x, index, with_entropy=True)
        b = native_logprobs.token_logprobs(x.contiguous(), index, with_entropy=True)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    x = strided.clone().requires_grad_()
    logp, _ = native_logprobs.token_logprobs(x[:1].expand(4, -1, -1), index, grad_in_logits=True)
    logp.sum().backward()  # a view's gradient: a new tensor, summed over the repeats by expand's backward
    y = strided[:1].expand(4, -1, -1).contiguous().requires_grad_()
    native_logprobs.token_logprobs(y, index)[0].sum().backward()
    assert torch.allclose(x.grad[0], y.grad.sum(0), atol=1e-6) and (x.grad[1:] == 0).all()


def test_wide_rows_masked_tokens_and_nan():
    """Logits spanning hundreds of nats (exp flushed below 3e-38, as torch's path flushes) and -inf (a filter's mask):
    finite log-probs and entropies (a masked token adds 0 log 0 = 0: torch's ops give NaN there), gradient 0 on the
    masked tokens, with the entropy's gradient too; a NaN row gives NaN, as torch's ops do."""
    logits, index = _logits(2, 4, 200, torch.float32, seed=6, scale=150.0)
    logits[0, :, ::3] = float("-inf")
    index[0] = torch.tensor([1, 2, 4, 5])  # unmasked tokens
    logits[1, 2, 17] = float("nan")
    x = logits.clone().requires_grad_()
    logp, entropy = native_logprobs.token_logprobs(x, index, with_entropy=True, entropy_grad=True)
    (logp[0].sum() + entropy[0].sum()).backward()
    want = (logits[0, :4].double().log_softmax(-1)).gather(-1, index[0, :, None]).squeeze(-1)
    assert torch.allclose(logp[0].double(), want, rtol=1e-6, atol=1e-6) and torch.isfinite(entropy[0]).all()
    kept = logits[0, :4].double().log_softmax(-1)
    assert torch.allclose(entropy[0].double(), -(kept.exp() * kept).nan_to_num().sum(-1), rtol=1e-6, atol=1e-6)
    assert (x.grad[0, :, ::3] == 0).all() and torch.isfinite(x.grad[0]).all()
    assert logp[1, 2].isnan() and entropy[1, 2].isnan() and torch.isfinite(logp[1, [0, 1, 3]]).all()


def test_bad_input_is_refused():
    logits, index = _logits(2, 3, 50, torch.bfloat16, seed=7)
    with pytest.raises(IndexError, match="outside the vocabulary"):
        native_logprobs.token_logprobs(logits, index + 50)
    with pytest.raises(ValueError, match="do not cover"):
        native_logprobs.token_logprobs(logits[:1], index)


def test_the_training_forward_takes_it_where_it_applies(monkeypatch):
    """completion_logprobs through the kernel: as algo.token_logprobs's ops within float roundings (loss gradients
    too), and taken exactly where `applies` says (AVX2 or AVX-512 builds: an SSE build keeps torch's ops)."""
    model = tiny_lm("llama", seed=1)
    batch = completion_batch()
    logits = torch.zeros(1, 2, 61)
    assert native_logprobs.applies(logits) == (native_logprobs.vector_bits() >= 256)
    outs = []
    for on in (False, True):
        monkeypatch.setattr(native_logprobs, "ON", on)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = completion_logprobs(model, *batch, temperature=0.9, with_entropy=True, entropy_grad=True)
        assert out.entropy is not None
        (out.logp * batch[3]).sum().add(out.entropy.sum()).backward()
        outs.append((out.logp.detach(), out.entropy.detach(), [p.grad.clone() for p in model.parameters()]))
    (a_logp, a_ent, a_grads), (b_logp, b_ent, b_grads) = outs
    assert torch.allclose(a_logp, b_logp, atol=2e-5) and torch.allclose(a_ent, b_ent, atol=2e-5)
    for a, b in zip(a_grads, b_grads):
        assert torch.allclose(a, b, rtol=2e-2, atol=2e-2 * a.abs().max().item())
