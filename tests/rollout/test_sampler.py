"""rlvr.rollout.engines.sampling.sample_tokens, the hf engine's sampler: inverse-CDF with one uniform per
row, against a float64 loop over the cumulative probabilities, and in distribution."""

import math

import pytest
import torch

import rlvr.rollout.engines.native_sampler as native_sampler
from rlvr.rollout.engines.sampling import filter_logits, sample_tokens


# a weight exp(x - max x) at or below exp(CUT) (3.2e-38) is 0 to the sampler (algo.exp_flushed); fp32 holds none below 1e-45
CUT = math.log(torch.finfo(torch.float32).tiny) + 1.0


def _reference(logits, u, temperature, top_k, top_p):
    """The first token whose cumulative probability exceeds u * total, by a Python loop in float64."""
    x = filter_logits(logits.double() / temperature, top_k, top_p)
    logp = x.masked_fill(x - x.amax(-1, keepdim=True) <= CUT, float("-inf")).log_softmax(-1)
    tokens = []
    for row, x in zip(logp.exp().tolist(), u.tolist()):
        target, acc = x * sum(row), 0.0
        tokens.append(next(i for i, p in enumerate(row) if (acc := acc + p) > target))
    return torch.tensor(tokens)


@pytest.mark.parametrize("scale", [3, 60])  # 60: rows spanning ~400 nats, the smallest weights flushed (algo.exp_flushed)
def test_inverse_cdf_against_a_float64_loop(scale):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 300, generator=g) * scale
    u = torch.rand(64, generator=g)
    u[:3] = torch.tensor([0.0, 1 - 2**-24, 0.5])  # both ends of torch.rand's range
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 20, 1.0), (1.3, 0, 0.9), (1.0, 50, 0.8)]:
        token, logp, entropy = sample_tokens(logits, u, temperature=temperature, top_k=top_k, top_p=top_p)
        assert torch.equal(token, _reference(logits, u, temperature, top_k, top_p))
        kept = filter_logits(logits / temperature, top_k, top_p).log_softmax(-1)
        torch.testing.assert_close(logp, kept.gather(-1, token[:, None]).squeeze(-1), rtol=0, atol=1e-6)
        assert torch.isfinite(logp).all()  # never a filtered-out (probability 0) token, u near 1 included
        full = (logits / temperature).double().log_softmax(-1)
        torch.testing.assert_close(entropy.double(), -(full.exp() * full).sum(-1), rtol=0, atol=1e-5)


def test_samples_follow_the_distribution():
    """200k draws from a 6-token distribution with a top-k cut: every frequency within 5 standard
    errors of its probability, and the cut tokens never drawn."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    n = 200_000
    u = torch.rand(n, generator=torch.Generator().manual_seed(0))
    token, _, _ = sample_tokens(logits.expand(n, 6), u, temperature=0.8, top_k=4)
    freq = torch.bincount(token, minlength=6).double() / n
    p = filter_logits((logits / 0.8)[None], 4, 1.0).softmax(-1)[0].double()
    assert freq[4:].sum() == 0
    for f, q in zip(freq[:4].tolist(), p[:4].tolist()):
        assert abs(f - q) < 5 * math.sqrt(q * (1 - q) / n), (f, q)


@pytest.mark.parametrize("native", [True, False])  # the unfiltered rows through the C pass (native_sampler) or torch's ops
@pytest.mark.parametrize("scale", [4, 50])  # 50: rows spanning ~400 nats, the smallest weights flushed (algo.exp_flushed)
def test_wide_vocabulary_in_blocks_against_float64(scale, native, monkeypatch):
    """Past DIRECT_CDF_MAX entries inverse_cdf goes by blocks: the same tokens as one float64 cumsum of the float64
    probabilities, a vocabulary not a multiple of the block, u at both ends, and whole blocks filtered out."""
    from rlvr.rollout.engines.sampling import CDF_BLOCK, DIRECT_CDF_MAX

    monkeypatch.setattr(native_sampler, "ON", native)

    g = torch.Generator().manual_seed(5)
    V = 3 * DIRECT_CDF_MAX + CDF_BLOCK // 2 + 3
    logits = torch.randn(256, V, generator=g) * scale
    u = torch.rand(256, generator=g)
    u[:4] = torch.tensor([0.0, 1 - 2**-24, 0.5, 1e-9])
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.5)]:
        token, logp, entropy = sample_tokens(logits, u, temperature=temperature, top_k=top_k, top_p=top_p)
        kept = filter_logits(logits.double() / temperature, top_k, top_p).log_softmax(-1)
        cdf = kept.masked_fill(kept - kept.amax(-1, keepdim=True) <= CUT, float("-inf")).exp().cumsum(-1)
        expected = torch.searchsorted(cdf, (u.double() * cdf[:, -1])[:, None], right=True).squeeze(-1)
        assert torch.equal(token, expected.clamp_max(V - 1))
        assert torch.isfinite(kept.gather(-1, token[:, None])).all()  # never a filtered-out token
        # up to a few roundings of the fp32 logits / T (wide rows: |logits / T| to 400, rounded by 3e-5)
        atol = 2e-6 + 4 * torch.finfo(torch.float32).eps * float((logits / temperature).abs().max())
        torch.testing.assert_close(logp.double(), kept.gather(-1, token[:, None]).squeeze(-1), rtol=0, atol=atol)
        full = (logits.double() / temperature).log_softmax(-1)
        torch.testing.assert_close(entropy.double(), -(full.exp() * full).sum(-1), rtol=0, atol=5e-6)


def test_zero_weights_are_never_drawn_in_either_level():
    """inverse_cdf over weights with whole zero blocks and zeros inside the chosen block, u from 0 to just below 1."""
    from rlvr.rollout.engines.sampling import CDF_BLOCK, inverse_cdf

    V = 40 * CDF_BLOCK + 7
    w = torch.zeros(5, V)
    w[:, 3 * CDF_BLOCK + 5] = 1.0  # one token in the 4th block
    w[:, 10 * CDF_BLOCK + 1 : 10 * CDF_BLOCK + 60 : 7] = 0.25  # every 7th token of the 11th block
    w[:, V - 1] = 1e-30  # the short last block: a tiny weight
    u = torch.tensor([0.0, 0.3, 0.6, 1 - 2**-24, 0.999999])
    token = inverse_cdf(w, u)
    assert (w.gather(-1, token[:, None]) > 0).all()
    cdf = w.double().cumsum(-1)
    assert torch.equal(token, torch.searchsorted(cdf, (u.double() * cdf[:, -1])[:, None], right=True).squeeze(-1).clamp_max(V - 1))
    again, total = inverse_cdf(w, u, with_total=True)  # the total the draw measured u against: every weight's
    assert torch.equal(again, token) and torch.allclose(total, cdf[:, -1], rtol=1e-15, atol=0)


@pytest.mark.parametrize("native", [True, False])
def test_without_entropy_the_same_draws_in_row_chunks(native, monkeypatch):
    """entropy=False (the callers that discard it) draws the same tokens and log-probs, None for the entropy; rows past
    SAMPLE_CHUNK logits go in chunks (the torch path's) and come back in order."""
    from rlvr.rollout.engines import sampling

    monkeypatch.setattr(native_sampler, "ON", native)

    g = torch.Generator().manual_seed(7)
    logits, u = torch.randn(9, 2000, generator=g) * 3, torch.rand(9, generator=g)
    token, logp, entropy = sample_tokens(logits, u, temperature=0.9)
    t2, l2, none = sample_tokens(logits, u, temperature=0.9, entropy=False)
    assert none is None and torch.equal(token, t2) and torch.equal(logp, l2)
    chunk, sampling.SAMPLE_CHUNK = sampling.SAMPLE_CHUNK, 4000  # two rows a chunk: five chunks
    try:
        chunked = sample_tokens(logits, u, temperature=0.9)
    finally:
        sampling.SAMPLE_CHUNK = chunk
    assert torch.equal(chunked[0], token) and torch.equal(chunked[1], logp) and torch.equal(chunked[2], entropy)


@pytest.mark.parametrize("scale", [3, 60])  # 60: the shifted logits clamped at the cut (algo.exp_flushed's clamp_in_place)
@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 40, 1.0), (0.8, 0, 0.95)])
def test_overwriting_the_logits_draws_the_same_bits(scale, temperature, top_k, top_p, monkeypatch):
    """overwrite=True (a decode step's logits, read by nothing after): the same tokens, log-probs and entropies bit for
    bit as with the logits left whole, which overwrite=False does (-inf logits among them: a model's masked tokens).
    The torch path's (the C pass of unfiltered rows, native_sampler, never writes over them)."""
    monkeypatch.setattr(native_sampler, "ON", False)
    g = torch.Generator().manual_seed(11)
    logits, u = torch.randn(16, 3000, generator=g) * scale, torch.rand(16, generator=g)
    logits[:, :7] = float("-inf")
    whole = logits.clone()
    drawn = sample_tokens(logits, u, temperature=temperature, top_k=top_k, top_p=top_p)
    assert torch.equal(logits, whole)
    overwritten = sample_tokens(logits, u, temperature=temperature, top_k=top_k, top_p=top_p, overwrite=True)
    assert all(torch.equal(a, b) for a, b in zip(drawn, overwritten))
    assert not torch.equal(logits, whole)  # it did write over them
    assert torch.isfinite(drawn[1]).all() and torch.isfinite(drawn[2]).all()


def _nucleus_by_sort(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p nucleus by a sort of every row: the reference (ties: the lower index first, as a stable sort)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    p = sorted_logits.softmax(-1)
    return torch.zeros_like(p, dtype=torch.bool).scatter(-1, order, p.cumsum(-1) - p >= top_p)


@pytest.mark.parametrize("candidates", [64, 0])  # 0: every row by bins
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_the_nucleus_is_the_sorted_rows(top_p, candidates, monkeypatch):
    """outside_nucleus against the full sort (float64, where no total sits within a rounding of top_p): peaked rows
    (nuclei of a few tokens, found among the heaviest), flat ones (hundreds: by bins), both in a batch, rows cut by
    top-k first (-inf), rows whose tail lies past the binned span, a vocabulary not a power of two."""
    from rlvr.rollout.engines import sampling

    monkeypatch.setattr(sampling, "NUCLEUS_CANDIDATES", candidates)

    g = torch.Generator().manual_seed(11)
    V = 1000
    flat = torch.randn(8, V, generator=g, dtype=torch.float64)
    peaked = flat * 6
    mixed = torch.cat([peaked[:7], flat[7:]])
    cut = filter_logits(flat * 3, 40, 1.0)
    wide = flat * 60  # rows spanning ~500 nats: most tokens below the span, in its last bin
    for logits in (peaked, flat, mixed, cut, wide):
        drop = sampling.outside_nucleus(logits, top_p)
        assert torch.equal(drop, _nucleus_by_sort(logits, top_p))
        kept = logits.softmax(-1).masked_fill(drop, 0).sum(-1)
        assert bool((kept >= top_p).all())  # the nucleus reaches top_p
    nucleus = lambda x: int((~sampling.outside_nucleus(x, top_p)).sum(-1).max())  # noqa: E731
    assert nucleus(peaked) < 64 and (top_p < 0.9 or nucleus(flat) > 500)


@pytest.mark.parametrize("candidates", [64, 0])
def test_a_nucleus_ending_among_tied_and_crowded_tokens(candidates, monkeypatch):
    """Logits on a grid of 1/256 nat (many tokens in each 1/64-nat bin, many tied), and on a grid of 1 nat (ties across
    the 64 heaviest's edge): the nucleus's last tokens in order of weight, the lower index first among ties, as a
    stable sort."""
    from rlvr.rollout.engines import sampling

    monkeypatch.setattr(sampling, "NUCLEUS_CANDIDATES", candidates)
    g = torch.Generator().manual_seed(12)
    fine = (torch.randn(16, 5000, generator=g, dtype=torch.float64) * 2 * 256).round() / 256
    coarse = (torch.randn(16, 5000, generator=g, dtype=torch.float64) * 3).round() + 10 * (torch.arange(16) < 8)[:, None]
    coarse[:8, :3] = 30.0  # half the rows: three tied heaviest tokens hold nearly all the weight
    for logits in (fine, coarse):
        for top_p in (0.3, 0.8, 0.97, 0.9999):
            assert torch.equal(sampling.outside_nucleus(logits, top_p), _nucleus_by_sort(logits, top_p))


def test_the_heaviest_tokens_from_the_heaviest_blocks_are_topks():
    """_heaviest's K weights are topk's, a vocabulary not a multiple of the block, ties included."""
    from rlvr.rollout.engines.sampling import _heaviest

    g = torch.Generator().manual_seed(14)
    for e in (torch.rand(6, 3001, generator=g), (torch.rand(6, 3001, generator=g) * 8).floor() / 8):
        top, idx = _heaviest(e, 64)
        assert torch.equal(top, e.topk(64, dim=-1).values) and torch.equal(e.gather(-1, idx), top)
        assert bool((idx.sort(-1).values.diff(dim=-1) > 0).all())  # 64 distinct tokens


@pytest.mark.parametrize("V", [32000, 151936])
def test_the_binned_nucleus_in_fp32_keeps_what_the_sort_keeps_up_to_rounding(V):
    """fp32 rows of a real vocabulary, zipf-like and flat: the nucleus differs from the sorted rows' only at tokens
    whose total before them lies within fp32's rounding of top_p."""
    from rlvr.rollout.engines import sampling

    g = torch.Generator().manual_seed(13)
    ranks = torch.stack([torch.randperm(V, generator=g) for _ in range(4)]).float()
    rows = torch.cat([-2 * torch.log1p(ranks) + 0.3 * torch.randn(4, V, generator=g), torch.randn(4, V, generator=g) * 3])
    for top_p in (0.9, 0.95):
        drop = sampling.outside_nucleus(rows, top_p)
        p = rows.double().softmax(-1)
        sorted_p, order = p.sort(dim=-1, descending=True, stable=True)
        before = torch.zeros_like(p).scatter(-1, order, sorted_p.cumsum(-1) - sorted_p)  # float64 total before each token
        differs = drop != _nucleus_by_sort(rows.double(), top_p)
        assert bool(((before[differs] - top_p).abs() < 1e-5).all())
        assert int(differs.sum()) <= 8


@pytest.mark.parametrize("scale", [3, 40])
def test_filtered_rows_draw_from_the_full_rows_weights_masked(scale):
    """With top-k / top-p the sampler masks the full row's weights instead of exponentiating the filtered logits
    again: the same tokens and log-probs, bit for bit, as that second exp (the most probable token is always kept,
    so both shift by the same max)."""
    from rlvr.rollout.engines.sampling import _shifted_exp, inverse_cdf

    g = torch.Generator().manual_seed(13)
    logits = torch.randn(32, 3000, generator=g) * scale
    u = torch.rand(32, generator=g)
    u[:2] = torch.tensor([0.0, 1 - 2**-24])
    for temperature, top_k, top_p in [(1.0, 20, 1.0), (1.0, 0, 0.9), (0.8, 50, 0.95), (1.3, 5, 0.5)]:
        token, logp, _ = sample_tokens(logits, u, temperature=temperature, top_k=top_k, top_p=top_p)
        kept_s, kept_e = _shifted_exp(filter_logits(logits / temperature, top_k, top_p))
        expected, total = inverse_cdf(kept_e, u, with_total=True)
        assert torch.equal(token, expected) and torch.equal(expected, inverse_cdf(kept_e, u))
        assert torch.equal(logp, (kept_s.gather(-1, expected[:, None]) - total.float()[:, None].log()).squeeze(-1))


def test_top_k_from_the_heaviest_blocks_is_topks_mask():
    """outside_top_k through the heaviest blocks (a wide vocabulary) keeps what a topk keeps: ties at the k-th kept,
    -inf logits, a vocabulary not a multiple of the block."""
    from rlvr.rollout.engines.sampling import outside_top_k

    g = torch.Generator().manual_seed(15)
    logits = (torch.randn(8, 20011, generator=g) * 4).round()  # many ties
    logits[:2, 5000:] = float("-inf")
    for k in (1, 5, 20, 60):
        drop = outside_top_k(logits, k)
        assert drop is not None and torch.equal(drop, logits < torch.topk(logits, k, dim=-1).values[:, -1:])
        assert bool(((~drop).sum(-1) >= k).all())


@pytest.mark.parametrize("scale", [2, 30])
def test_min_p_keeps_what_transformers_min_p_warper_keeps(scale):
    """rollout.min_p (TRL's min_p) after top-k and top-p, as transformers' generate orders its warpers: the tokens of
    a float64 loop over the weights transformers' MinPLogitsWarper leaves, the log-prob of that distribution, and the
    entropy still the whole row's."""
    from transformers.generation.logits_process import MinPLogitsWarper

    g = torch.Generator().manual_seed(21)
    logits = torch.randn(64, 3000, generator=g) * scale
    u = torch.rand(64, generator=g)
    u[:2] = torch.tensor([0.0, 1 - 2**-24])
    cut = 0
    for temperature, top_k, top_p, min_p in [(1.0, 0, 1.0, 0.1), (0.7, 0, 1.0, 0.02), (1.0, 40, 1.0, 0.3), (1.2, 0, 0.9, 0.05)]:
        token, logp, entropy = sample_tokens(logits, u, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        x = MinPLogitsWarper(min_p)(None, filter_logits(logits.double() / temperature, top_k, top_p))
        logq = x.masked_fill(x - x.amax(-1, keepdim=True) <= CUT, float("-inf")).log_softmax(-1)
        expected = []
        for row, v in zip(logq.exp().tolist(), u.tolist()):
            target, acc = v * sum(row), 0.0
            expected.append(next(i for i, p in enumerate(row) if (acc := acc + p) > target))
        assert torch.equal(token, torch.tensor(expected)), (temperature, top_k, top_p, min_p)
        cut += int(((x > float("-inf")).sum(-1) < (filter_logits(logits / temperature, top_k, top_p) > float("-inf")).sum(-1)).sum())
        torch.testing.assert_close(logp.double(), logq.gather(-1, token[:, None]).squeeze(-1), rtol=0, atol=1e-5)
        full = (logits / temperature).double().log_softmax(-1)
        torch.testing.assert_close(entropy.double(), -(full.exp() * full).sum(-1), rtol=0, atol=1e-5)
    assert cut > 64  # rows min-p cut tokens from
