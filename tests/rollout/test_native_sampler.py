"""The decode sampler's unfiltered draw as a C pass (rlvr.rollout.engines.native_sampler) against sampling.py's torch
ops and float64: the same tokens for the same random numbers (the weights' exp is the kernel's own, so a token may
differ only within a rounding of a boundary: none does on these rows), log-probs and entropies within float
roundings, quantiles of the float64 distribution on a grid of random numbers, tokens of weight 0 never drawn, the
same bits for a row alone or in a batch at any thread count, and the filters, narrow vocabularies and other dtypes
left to the torch path."""

import pytest
import torch

import rlvr.rollout.engines.native_sampler as native_sampler
from rlvr.models import native_build
from rlvr.rollout.engines.sampling import sample_tokens


def setup_module():
    assert native_sampler._kernel() is not None, native_build.why_not(native_sampler.SOURCE)  # CI's machines have a compiler


def _rows(n, V, dtype, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, V, generator=g) * scale).to(dtype), torch.rand(n, generator=g)


def _torch_path(logits, u, T, monkeypatch, entropy=True):
    monkeypatch.setattr(native_sampler, "ON", False)
    try:
        return sample_tokens(logits.clone(), u, temperature=T, entropy=entropy)
    finally:
        monkeypatch.setattr(native_sampler, "ON", True)


@pytest.mark.parametrize("V", [1025, 1537, 32000, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1.0, 0.7])
def test_the_same_tokens_as_the_torch_path(V, dtype, T, monkeypatch):
    logits, u = _rows(48, V, dtype, seed=V)
    assert native_sampler.applies(logits, 0, 1.0, 0.0) == (native_sampler.vector_bits() >= 256)
    token, logp, entropy = native_sampler.sample_rows(logits, u, T)
    # the torch path on fp32 logits (bf16 widened exactly): on bf16 ones it shifts and divides in bf16, as the decode
    # never hands it (its logits are fp32), a rounding of the logit there
    t_token, t_logp, t_entropy = _torch_path(logits.float(), u, T, monkeypatch)
    assert torch.equal(token, t_token)
    assert entropy is not None and t_entropy is not None
    assert torch.allclose(logp, t_logp, atol=2e-5, rtol=1e-6) and torch.allclose(entropy, t_entropy, atol=1e-5, rtol=1e-6)
    x = logits.double() / T  # the float64 truth: u lies in each token's interval of the CDF
    want = x.log_softmax(-1)
    cdf = want.exp().cumsum(-1)
    above, below = (
        cdf.gather(-1, token[:, None]).squeeze(-1),
        cdf.gather(-1, token[:, None]).squeeze(-1) - want.exp().gather(-1, token[:, None]).squeeze(-1),
    )
    assert ((below <= u.double() + 1e-6) & (u.double() <= above + 1e-6)).all()
    assert torch.allclose(logp.double(), want.gather(-1, token[:, None]).squeeze(-1), atol=2e-5)
    assert torch.allclose(entropy.double(), -(want.exp() * want).sum(-1), atol=2e-5)
    routed = sample_tokens(logits.float(), u, temperature=T)  # the kernel where it applies, else the torch path
    assert torch.equal(routed[0], token)


def test_a_grid_of_random_numbers_draws_the_float64_quantiles():
    """Row r drawn with u = (k + 0.5) / K for k < K: each token k's count is K p_k to within 2 (the quantiles of
    float64's distribution), and never a token of p below 1 / K more than once."""
    V, K = 3000, 4096
    logits, _ = _rows(1, V, torch.float32, seed=9, scale=2.0)
    u = (torch.arange(K, dtype=torch.float64) + 0.5) / K
    token, _, _ = native_sampler.sample_rows(logits.expand(K, V), u.float(), 1.0, with_entropy=False)
    counts = torch.bincount(token, minlength=V).double()
    p = logits[0].double().softmax(-1)
    assert (counts - K * p).abs().max() <= 2


def test_tokens_of_weight_zero_are_never_drawn():
    """Masked (-inf) tokens and ones below e x the smallest normal float weigh 0: not drawn even at u near 0 and 1."""
    V = 2048
    logits = torch.full((6, V), float("-inf"))
    logits[:, 700] = 0.0
    logits[:, 1500] = 1.0
    logits[:, 64:128] = -200.0  # a whole block of flushed weights
    u = torch.tensor([0.0, 1e-9, 0.4, 0.9, 1 - 1e-7, 0.99999994])
    token, logp, entropy = native_sampler.sample_rows(logits, u, 1.0)
    assert set(token.tolist()) <= {700, 1500} and token[0] == 700 and token[-1] == 1500
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
    two = torch.tensor([0.0, 1.0], dtype=torch.float64).log_softmax(0)  # the two tokens' log-probs
    assert torch.allclose(entropy.double(), -(two.exp() * two).sum().expand(6), atol=1e-6)
    assert torch.allclose(logp.double(), two[(token == 1500).long()], atol=1e-6)


def test_a_row_gives_the_same_bits_alone_or_in_a_batch_at_any_thread_count():
    logits, u = _rows(40, 5000, torch.bfloat16, seed=3)
    whole = native_sampler.sample_rows(logits, u, 0.8)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            for r in (0, 17, 39):
                one = native_sampler.sample_rows(logits[r : r + 1], u[r : r + 1], 0.8)
                assert all(torch.equal(a, b[r : r + 1]) for a, b in zip(one, whole))  # type: ignore[index]
    finally:
        torch.set_num_threads(threads)
    strided = torch.cat([logits, logits], 1)[:, :5000]  # rows of a wider tensor
    assert all(torch.equal(a, b) for a, b in zip(native_sampler.sample_rows(strided, u, 0.8), whole))  # type: ignore[arg-type]


def test_filters_narrow_vocabularies_and_other_dtypes_keep_the_torch_path():
    wide = torch.zeros(2, 4096)
    assert not native_sampler.applies(wide, 50, 1.0, 0.0)
    assert not native_sampler.applies(wide, 0, 0.9, 0.0)
    assert not native_sampler.applies(wide, 0, 1.0, 0.05)
    assert not native_sampler.applies(torch.zeros(2, 1024), 0, 1.0, 0.0)
    assert not native_sampler.applies(wide.half(), 0, 1.0, 0.0)
    assert native_sampler.applies(wide, 4096, 1.0, 0.0) == (native_sampler.vector_bits() >= 256)  # top-k of all: no filter
