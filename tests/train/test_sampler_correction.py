"""Importance weights for a sampler (vLLM) whose probabilities differ from the trainer's:
the weights by hand, their direction (they turn an expectation under the sampler into one
under the trainer), and their effect through the trainer."""

import math

import pytest
import torch

from rlvr.algo import BatchNorms, policy_loss, sampler_correction
from rlvr.config import applied_sampler_correction


def test_weights_by_hand():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.3]], dtype=torch.float64))
    samp = torch.log(torch.tensor([[0.25, 0.4, 0.1], [0.3, 0.1, 0.9]], dtype=torch.float64))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    # p_trainer / p_sampler = [[2, 0.5, 9], [1, 3, (masked)]]
    truncated = sampler_correction(old, samp, mask, "token_truncate", cap=2.5)
    torch.testing.assert_close(truncated, torch.tensor([[2, 0.5, 2.5], [1, 2.5, 0]], dtype=torch.float64), rtol=0, atol=1e-12)
    masked = sampler_correction(old, samp, mask, "token_mask", cap=2.5)
    torch.testing.assert_close(masked, torch.tensor([[2, 0.5, 0], [1, 0, 0]], dtype=torch.float64), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="token_truncate"):
        sampler_correction(old, samp, mask, "tis", cap=2.5)


def test_weights_are_one_when_sampler_and_trainer_agree_and_change_nothing():
    torch.manual_seed(0)
    logp = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    mask = (torch.rand(4, 6) > 0.3).to(torch.float64)
    adv = torch.randn(4, dtype=torch.float64)
    norms = BatchNorms(4, int(mask.sum()), 6)
    w = sampler_correction(logp.detach(), logp.detach(), mask, "token_truncate", cap=3.0)
    assert torch.equal(w, mask)
    plain = policy_loss(logp, logp.detach(), adv, mask, norms).loss
    weighted = policy_loss(logp, logp.detach(), adv, mask, norms, token_weights=w).loss
    assert weighted.item() == plain.item()


def test_weights_turn_the_samplers_expectation_into_the_trainers():
    """Enumerate a 7-token vocabulary: tokens drawn from the sampler q, weighted by p/q, give
    exactly the policy gradient of E_p[A] under the trainer's p (with a cap that never binds)."""
    torch.manual_seed(1)
    theta = torch.randn(7, dtype=torch.float64, requires_grad=True)  # trainer logits
    q = torch.softmax(torch.randn(7, dtype=torch.float64), 0)  # sampler probabilities
    A = torch.randn(7, dtype=torch.float64)
    logp = torch.log_softmax(theta, 0)
    w = sampler_correction(logp.detach()[:, None], q.log()[:, None], torch.ones(7, 1, dtype=torch.float64), "token_truncate", cap=1e9)
    surrogate = (q[:, None] * w * A[:, None] * torch.exp(logp - logp.detach())[:, None]).sum()
    (g_is,) = torch.autograd.grad(surrogate, theta)
    (g_true,) = torch.autograd.grad((torch.softmax(theta, 0) * A).sum(), theta)
    torch.testing.assert_close(g_is, g_true, rtol=1e-12, atol=1e-12)
    # without the weights the gradient is that of the wrong distribution
    logp = torch.log_softmax(theta, 0)
    (g_plain,) = torch.autograd.grad((q * A * torch.exp(logp - logp.detach())).sum(), theta)
    assert (g_plain - g_true).abs().max() > 1e-2


def test_hf_engine_sampling_logprobs_match_the_trainer(make_trainer, tmp_path):
    """The hf engine samples from the trained model itself: its reported log-probs agree with the
    training forward's to fp32 rounding, so `auto` applies no correction there."""
    from test_trainer_variants import CHECKSUM, reward_file  # the trainer tests' helpers

    t = make_trainer(reward_file(tmp_path, CHECKSUM, "checksum"), "rollout.max_new_tokens=8")
    assert t.cfg.algo.sampler_correction == "auto" and applied_sampler_correction(t.cfg) == "none"
    m = t.train_step()
    assert 0 <= m["sampling/sampling_logp_difference/max"] < 1e-4
    assert m["sampling/sampling_logp_difference/mean"] < 1e-5
    assert "sampling/importance_sampling_ratio/mean" not in m


@pytest.mark.parametrize(
    "mode, cap, factor",
    [
        ("token_truncate", 3.0, 2.0),
        ("token_truncate", 1.5, 1.5),
        ("token_mask", 1.5, 0.0),
        ("sequence_truncate", 3.0, 2.0),
        ("sequence_truncate", 1.5, 1.5),
        ("sequence_mask", 1.5, 0.0),
    ],
)
def test_trainer_scales_the_policy_gradient_by_the_weights(make_trainer, tmp_path, mode, cap, factor):
    """A sampler that reported every token (sequence modes: every completion) as half as likely as the trainer finds
    it: weights 2, so the gradient doubles (capped at 1.5: x1.5; masked beyond 1.5: zero)."""
    from test_trainer_variants import CHECKSUM, advantages_of, reward_file  # the trainer tests' helpers

    grads, metrics = {}, {}
    for name, overrides in (
        ("plain", ["algo.sampler_correction=none"]),
        ("corrected", [f"algo.sampler_correction={mode}", f"algo.sampler_correction_cap={cap}"]),
    ):
        t = make_trainer(reward_file(tmp_path, CHECKSUM, "checksum"), "optim.max_grad_norm=0", *overrides, run=name)
        batch = t.collector.collect(t.state)
        ep = batch.episodes
        per_token = ep.loss_mask / ep.loss_mask.sum(-1, keepdim=True).clamp(min=1) if mode.startswith("sequence") else ep.loss_mask
        ep.sampling_logprobs = ep.sampling_logprobs - math.log(2.0) * per_token
        adv = advantages_of(t, batch)
        assert adv.abs().max() > 0
        metrics[name] = t.updater(ep, adv).metrics
        grads[name] = torch.cat([p.grad.flatten() for p in t.model.parameters()])
    torch.testing.assert_close(grads["corrected"], factor * grads["plain"], rtol=1e-4, atol=1e-7)
    if not mode.startswith("sequence"):
        assert metrics["plain"]["sampling/sampling_logp_difference/mean"] == pytest.approx(math.log(2.0), abs=1e-5)
    corrected = metrics["corrected"]
    assert corrected["sampling/importance_sampling_ratio/mean"] == pytest.approx(factor, abs=1e-4)
    assert corrected["sampling/importance_sampling_ratio/min"] == pytest.approx(factor, abs=1e-4)  # every weight the same
    assert corrected["sampling/importance_sampling_ratio/max"] == pytest.approx(factor, abs=1e-4)


def test_sequence_weights_are_averaged_over_completions(make_trainer, tmp_path):
    """TRL logs a sequence mode's weights per completion: their mean over the trained completions, not over tokens."""
    from test_trainer_variants import CHECKSUM, advantages_of, reward_file  # the trainer tests' helpers

    overrides = ("algo.sampler_correction=sequence_truncate", "algo.sampler_correction_cap=10", "rollout.max_new_tokens=12")
    t = make_trainer(reward_file(tmp_path, CHECKSUM, "checksum"), *overrides)
    batch = t.collector.collect(t.state)
    ep = batch.episodes
    lengths = ep.loss_mask.sum(-1)  # [N]
    weights = 1.5 + 0.5 * (torch.arange(len(lengths)) % 7).double()  # [N] the sampler's ratio per completion
    ep.sampling_logprobs = ep.sampling_logprobs - (weights.log() / lengths.clamp(min=1)).unsqueeze(-1).float() * ep.loss_mask
    adv = advantages_of(t, batch)
    trained = (adv != 0) & (lengths > 0)
    assert trained.any() and lengths[trained].unique().numel() > 1  # a token-weighted mean would differ
    m = t.updater(ep, adv).metrics
    assert m["sampling/importance_sampling_ratio/mean"] == pytest.approx(float(weights[trained].mean()), rel=1e-4)
    assert m["sampling/importance_sampling_ratio/min"] == pytest.approx(float(weights[trained].min()), rel=1e-4)
    assert m["sampling/importance_sampling_ratio/max"] == pytest.approx(float(weights[trained].max()), rel=1e-4)


def test_sequence_weights_by_hand():
    """One weight per completion: the product of its tokens' ratios, bounded as a whole (TRL's sequence_* modes)."""
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.3], [0.4, 0.4, 0.4]], dtype=torch.float64))
    samp = torch.log(torch.tensor([[0.25, 0.4, 0.1], [0.3, 0.1, 0.9], [0.8, 0.4, 0.1]], dtype=torch.float64))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0]], dtype=torch.float64)
    # products over the mask: 2 x 0.5 x 9 = 9; 1 x 3 = 3; 0.5 x 1 = 0.5
    w = sampler_correction(old, samp, mask, "sequence_truncate", cap=4.0)
    torch.testing.assert_close(w, torch.tensor([[4.0], [3.0], [0.5]], dtype=torch.float64), rtol=1e-12, atol=0)
    w = sampler_correction(old, samp, mask, "sequence_truncate", cap=4.0, low=0.8)
    torch.testing.assert_close(w, torch.tensor([[4.0], [3.0], [0.8]], dtype=torch.float64), rtol=1e-12, atol=0)
    w = sampler_correction(old, samp, mask, "sequence_mask", cap=4.0, low=0.8)
    torch.testing.assert_close(w, torch.tensor([[0.0], [3.0], [0.0]], dtype=torch.float64), rtol=1e-12, atol=0)
    w = sampler_correction(old, samp, mask, "token_mask", cap=math.inf, low=0.8)  # per token: [[2, 0, 9], [1, 3, -]]
    torch.testing.assert_close(w[:2], torch.tensor([[2, 0, 9], [1, 3, 0]], dtype=torch.float64), rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min, clip_max", [(None, 3.0), (0.5, 3.0), (0.9, None), (None, 1.2)])
def test_weights_are_trls(mode, clip_min, clip_max):
    """Every mode and bound against TRL 1.16's code (tests/_trl_grpo.py): the weights where the loss reads them, and the
    statistics it logs; a token the sampler did not score (NaN) counts as agreeing, as there."""
    from _trl_grpo import trl_importance_sampling

    g = torch.Generator().manual_seed(3)
    old = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 3
    samp = old + torch.randn(6, 9, generator=g, dtype=torch.float64) * 0.6
    samp[3, :3] -= 0.5  # a completion whose weight passes 3
    samp[1, 2] = samp[4, 0] = float("nan")
    lengths = torch.tensor([9, 5, 1, 7, 3, 8])
    mask = (torch.arange(9) < lengths[:, None]).to(torch.float64)
    expected, (lo, mean, hi) = trl_importance_sampling(old, samp, mask, mode, clip_min, clip_max)
    w = sampler_correction(old, samp, mask, mode, cap=math.inf if clip_max is None else clip_max, low=clip_min)
    torch.testing.assert_close(w * mask, expected * mask, rtol=1e-12, atol=0)  # the loss reads the weights on the mask
    assert w.shape == expected.shape
    unbounded, _ = trl_importance_sampling(old, samp, mask, mode, None, math.inf)
    assert not torch.equal(expected * mask, unbounded * mask)  # the bounds bind in these draws
