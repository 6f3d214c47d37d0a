"""The clipped policy loss, the dapo aggregation, k3 KL and selective log-softmax, checked by hand."""

import pytest
import torch

from rlvr.algo import BatchNorms, kl_estimate, policy_loss, selective_log_softmax, token_entropy


def _norms(mask):
    return BatchNorms(num_sequences=mask.shape[0], num_tokens=int(mask.sum()), max_completion_length=mask.shape[1])


def test_ratio_one_gives_the_gradient_of_advantage_weighted_log_likelihood():
    torch.manual_seed(0)
    logp = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([1.5, -0.5, 2.0], dtype=torch.float64)
    out = policy_loss(logp, logp.detach(), adv, mask, _norms(mask))
    out.loss.backward()
    # d/dlogp of -sum(A_i * logp_it * m_it) / num_tokens
    expected = -(adv[:, None] * mask) / mask.sum()
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)
    assert out.loss.item() == pytest.approx(-(adv[:, None] * mask).sum().item() / 9, abs=1e-12)
    assert out.region_clipped.item() == 0.0


def test_clipped_tokens_have_zero_gradient():
    old = torch.zeros(2, 2, dtype=torch.float64)
    # row 0: A > 0 and ratio 1.5 > 1.2 (clipped); row 1: A < 0 and ratio 0.5 < 0.8 (clipped)
    logp = torch.log(torch.tensor([[1.5, 1.1], [0.5, 0.9]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    out = policy_loss(logp, old, adv, mask, _norms(mask), epsilon=0.2)
    out.loss.backward()
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[1, 0].item() == 0.0
    # unclipped tokens: d(-r*A)/dlogp = -r*A / num_tokens
    assert logp.grad[0, 1].item() == pytest.approx(-1.1 / 4, abs=1e-12)
    assert logp.grad[1, 1].item() == pytest.approx(0.9 / 4, abs=1e-12)
    assert out.high_clipped.item() == pytest.approx(0.25) and out.low_clipped.item() == pytest.approx(0.25)


def test_clip_is_one_sided_for_the_pessimistic_bound():
    # A > 0 with ratio below 1 - eps is NOT clipped (min picks the unclipped, smaller objective)
    logp = torch.log(torch.tensor([[0.5]], dtype=torch.float64)).requires_grad_(True)
    out = policy_loss(logp, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64), _norms(torch.ones(1, 1)))
    out.loss.backward()
    assert logp.grad.item() == pytest.approx(-0.5, abs=1e-12)


def test_dapo_aggregation_over_ragged_masks():
    per_tok = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    # logp = old, advantage -1: the per-token loss equals the ratio (=1) x 1 -> use logp offsets instead
    logp = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([-1.0, -1.0], dtype=torch.float64)
    out = policy_loss(logp, logp, adv, mask, _norms(mask))
    assert out.loss.item() == pytest.approx(1.0)  # 4 tokens each with loss 1, divided by 4 tokens
    # token-level: a long completion weighs more than a short one (unlike the grpo per-sequence mean)
    adv = torch.tensor([-1.0, -3.0], dtype=torch.float64)
    out = policy_loss(logp, logp, adv, mask, _norms(mask))
    assert out.loss.item() == pytest.approx((3 * 1 + 1 * 3) / 4)
    del per_tok


def test_dapo_normaliser_is_the_whole_batch():
    logp = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([-1.0, -1.0], dtype=torch.float64)
    norms = BatchNorms(num_sequences=8, num_tokens=16, max_completion_length=3, num_micro_batches=4)
    assert policy_loss(logp, logp, adv, mask, norms).loss.item() == pytest.approx(4 / 16)


def test_k3_is_zero_at_the_reference_and_positive_elsewhere():
    logp = torch.log(torch.tensor([[0.2, 0.5, 0.9]], dtype=torch.float64))
    assert kl_estimate(logp, logp).abs().max().item() == 0.0
    ref = torch.log(torch.tensor([[0.3, 0.4, 0.1]], dtype=torch.float64))
    kl = kl_estimate(logp, ref)
    assert (kl > 0).all()
    ratio = torch.exp(ref - logp)
    torch.testing.assert_close(kl, ratio - torch.log(ratio) - 1, rtol=0, atol=1e-12)


def test_kl_term_enters_the_loss_with_beta():
    logp = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    ref = torch.log(torch.tensor([[0.25, 0.5]], dtype=torch.float64))
    mask = torch.ones(1, 2, dtype=torch.float64)
    out = policy_loss(logp, logp, torch.zeros(1, dtype=torch.float64), mask, _norms(mask), beta=0.1, ref_logp=ref)
    k3_first = 0.5 - torch.log(torch.tensor(0.5, dtype=torch.float64)).item() - 1
    assert out.kl.item() == pytest.approx(k3_first / 2)
    assert out.loss.item() == pytest.approx(0.1 * k3_first / 2)


def test_selective_log_softmax_matches_log_softmax():
    torch.manual_seed(1)
    logits = torch.randn(5, 7, 11)
    idx = torch.randint(0, 11, (5, 7))
    expected = logits.log_softmax(-1).gather(-1, idx[..., None]).squeeze(-1)
    torch.testing.assert_close(selective_log_softmax(logits, idx, chunk_rows=2), expected, rtol=0, atol=1e-5)
    p = logits.softmax(-1)
    torch.testing.assert_close(token_entropy(logits, chunk_rows=3), -(p * p.log()).sum(-1), rtol=0, atol=1e-5)
