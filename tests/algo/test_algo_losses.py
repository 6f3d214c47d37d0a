"""The pieces of the policy loss checked on hand-computed cases: the clipped objective's gradient
case by case, GSPO's sequence ratio, KL estimators, the top-entropy mask, log-probs from logits,
and the registries (declarations, docstrings, refusals). Random inputs against a loop reference:
test_algo_variants.py."""

import itertools
import math

import pytest
import torch

from rlvr import algo
from rlvr.algo import BatchNorms, kl_estimate, policy_loss, selective_log_softmax, token_entropy

D = torch.float64
TOL = dict(rtol=0, atol=1e-10)
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]


def norms_of(mask, max_len):
    return BatchNorms(num_sequences=mask.shape[0], num_tokens=int(mask.sum()), max_completion_length=max_len)


# ---------------------------------------------------------------------------------------------
# the clipped objective's gradient, case by case


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_at_ratio_one_the_gradient_is_that_of_advantage_weighted_log_likelihood(loss_type, level):
    g = torch.Generator().manual_seed(4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=D)
    N, max_len = mask.shape[0], 7
    logp = (-3 * torch.rand(N, 5, generator=g, dtype=D)).requires_grad_(True)
    adv = torch.tensor([1.5, -0.5, 2.0, 0.7], dtype=D)
    out = policy_loss(logp, logp.detach(), adv, mask, norms_of(mask, max_len), loss_type=loss_type, importance_level=level)
    out.loss.backward()
    # loss and gradient of -sum_i c_i * A_i * sum_t r_it at r = 1, with c_i the aggregation's weight of row i
    expected, expected_loss = torch.zeros(N, 5, dtype=D), 0.0
    for i in range(N):
        n_i = int(mask[i].sum())
        c = {"grpo": 1 / (max(n_i, 1) * N), "bnpo": 1 / mask.sum().item(), "dr_grpo": 1 / (N * max_len), "dapo": 1 / mask.sum().item()}[
            loss_type
        ]
        expected[i, :n_i] = -c * adv[i].item()
        expected_loss += -c * adv[i].item() * n_i
    torch.testing.assert_close(logp.grad, expected, **TOL)
    assert out.loss.item() == pytest.approx(expected_loss, abs=1e-12)
    assert out.region_clipped.item() == 0.0


def _one_token_rows(ratios, advs):
    old = torch.zeros(len(ratios), 1, dtype=D)
    lp = torch.log(torch.tensor(ratios, dtype=D))[:, None].requires_grad_(True)
    mask = torch.ones(len(ratios), 1, dtype=D)
    return lp, old, torch.tensor(advs, dtype=D), mask


def test_clip_zeroes_the_gradient_only_on_the_side_the_advantage_pushes():
    # A>0 past 1+eps, A<0 below 1-eps: clipped. A>0 below 1-eps, A<0 above 1+eps: not (the min keeps the worse).
    ratios, advs = [1.5, 0.5, 0.5, 1.5, 1.1, 0.9], [1.0, -1.0, 1.0, -1.0, 2.0, -1.0]
    lp, old, adv, mask = _one_token_rows(ratios, advs)
    out = policy_loss(lp, old, adv, mask, norms_of(mask, 1), loss_type="dapo", epsilon=0.2)
    out.loss.backward()
    T = 6
    expected_grad = [0.0, 0.0, -1.0 * 0.5 / T, 1.0 * 1.5 / T, -2.0 * 1.1 / T, 0.9 / T]  # d(-r A)/dlogp = -r A
    torch.testing.assert_close(lp.grad[:, 0], torch.tensor(expected_grad, dtype=D), **TOL)
    expected_loss = (-1.2 * 1.0 + -0.8 * -1.0 + -0.5 * 1.0 + -1.5 * -1.0 + -1.1 * 2.0 + 0.9) / T
    assert out.loss.item() == pytest.approx(expected_loss, abs=1e-12)
    assert out.high_clipped.item() == pytest.approx(1 / T)
    assert out.low_clipped.item() == pytest.approx(1 / T)
    assert out.region_clipped.item() == pytest.approx(2 / T)


def test_clip_higher_widens_only_the_upper_side():
    ratios, advs = [1.25, 1.25, 0.75], [1.0, 1.0, -1.0]
    for eps_high, grad0_zero in [(None, True), (0.28, False)]:
        lp, old, adv, mask = _one_token_rows(ratios, advs)
        out = policy_loss(lp, old, adv, mask, norms_of(mask, 1), loss_type="dapo", epsilon=0.2, epsilon_high=eps_high)
        out.loss.backward()
        assert (lp.grad[0, 0].item() == 0.0) is grad0_zero
        assert lp.grad[2, 0].item() == 0.0  # the low side stays at 1 - epsilon = 0.8 either way
        assert out.high_clipped.item() == pytest.approx(2 / 3 if grad0_zero else 0.0)


def test_delta_caps_the_ratio_of_negative_advantages():
    # A<0 and r=3: the min takes r*A (unclipped side); delta=2 caps it at 2*A with zero gradient.
    ratios, advs = [3.0, 1.5, 3.0], [-1.0, -1.0, 1.0]
    for delta in [None, 2.0]:
        lp, old, adv, mask = _one_token_rows(ratios, advs)
        out = policy_loss(lp, old, adv, mask, norms_of(mask, 1), loss_type="dapo", epsilon=0.2, delta=delta)
        out.loss.backward()
        first = 3.0 if delta is None else 2.0
        assert out.loss.item() == pytest.approx((first + 1.5 - 1.2) / 3, abs=1e-12)
        assert lp.grad[0, 0].item() == pytest.approx(1.0 if delta is None else 0.0, abs=1e-12)
        assert lp.grad[1, 0].item() == pytest.approx(1.5 / 3, abs=1e-12)  # below delta: untouched
        assert lp.grad[2, 0].item() == 0.0  # A>0 above 1+eps: clipped as before


# ---------------------------------------------------------------------------------------------
# GSPO


def test_gspo_ratio_is_exp_of_the_mean_token_log_ratio_per_sequence():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=D)
    old = torch.zeros(2, 4, dtype=D)
    # row 0: token ratios 3.0, 0.5, 1.0 -> sequence ratio (1.5)^(1/3) = 1.1447; padding garbage is ignored
    logp = torch.log(torch.tensor([[3.0, 0.5, 1.0, 50.0], [1.1, 1.1, 0.01, 9.0]], dtype=D)).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0], dtype=D)
    out = policy_loss(logp, old, adv, mask, norms_of(mask, 4), loss_type="dapo", importance_level="sequence", epsilon=0.2)
    out.loss.backward()
    s0, s1 = 1.5 ** (1 / 3), 1.1
    # neither sequence is clipped: 1.1447 < 1.2; yet at token level row 0's 3.0 and 0.5 would be
    assert out.loss.item() == pytest.approx((-3 * s0 * 1.0 + -2 * s1 * -1.0) / 5, abs=1e-12)
    # d/dlogp_it of -n_i s_i A_i / T with s_i = exp(mean_t l_it): -A_i s_i / T on every real token
    expected = torch.tensor([[-s0 / 5] * 3 + [0.0], [s1 / 5] * 2 + [0.0, 0.0]], dtype=D)
    torch.testing.assert_close(logp.grad, expected, **TOL)
    assert out.region_clipped.item() == 0.0

    tok = policy_loss(logp.detach(), old, adv, mask, norms_of(mask, 4), loss_type="dapo", importance_level="token")
    assert tok.high_clipped.item() == pytest.approx(1 / 5)  # the 3.0 token, clipped at token level
    assert tok.loss.item() != pytest.approx(out.loss.item())


def test_gspo_clips_whole_sequences():
    mask = torch.ones(1, 3, dtype=D)
    logp = torch.log(torch.tensor([[1.5, 1.5, 1.5]], dtype=D)).requires_grad_(True)
    out = policy_loss(
        logp, torch.zeros(1, 3, dtype=D), torch.ones(1, dtype=D), mask, norms_of(mask, 3), importance_level="sequence", epsilon=0.2
    )
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-1.2, abs=1e-12)
    assert torch.all(logp.grad == 0)
    assert out.high_clipped.item() == 1.0


# ---------------------------------------------------------------------------------------------
# KL estimators, top-entropy tokens, log-probs


def test_kl_estimator_values_by_hand():
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=D)
    ref = torch.tensor([-2.0, -1.0, -0.5], dtype=D)
    x = [-1.0, 1.0, 0.0]  # ref - logp
    for est, f in {"k1": lambda v: -v, "k2": lambda v: v * v / 2, "k3": lambda v: math.exp(v) - v - 1}.items():
        got = kl_estimate(logp, ref, est)
        for j in range(3):
            assert got[j].item() == pytest.approx(f(x[j]), abs=1e-15)
    assert kl_estimate(logp, logp, "k3").abs().max().item() == 0.0
    with pytest.raises(ValueError, match="k1"):
        kl_estimate(logp, ref, "k4")


def test_k1_and_k3_are_unbiased_and_k2_close_for_nearby_policies():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=g, dtype=D), -1)
    q = torch.softmax(torch.log(p) + 0.3 * torch.randn(6, generator=g, dtype=D), -1)
    exact = sum(p[j].item() * math.log(p[j].item() / q[j].item()) for j in range(6))
    idx = torch.multinomial(p, 400_000, replacement=True, generator=g)
    logp, ref = torch.log(p)[idx], torch.log(q)[idx]
    for est, tol in [("k1", 0.004), ("k3", 0.002), ("k2", 0.01)]:
        assert kl_estimate(logp, ref, est).mean().item() == pytest.approx(exact, abs=tol), est
    assert (kl_estimate(logp, ref, "k3") >= 0).all() and (kl_estimate(logp, ref, "k2") >= 0).all()


def test_high_entropy_mask_keeps_the_top_quantile_of_the_batch():
    g = torch.Generator().manual_seed(0)
    ent = torch.rand(5, 7, generator=g, dtype=D)
    mask = torch.zeros(5, 7, dtype=D)
    for i, n in enumerate([7, 3, 0, 5, 1]):
        mask[i, :n] = 1
    q = 0.2
    vals = sorted(ent[i, t].item() for i in range(5) for t in range(7) if mask[i, t])
    pos = (len(vals) - 1) * (1 - q)  # linear interpolation, as numpy / torch.quantile
    lo = int(math.floor(pos))
    thr = vals[lo] + (vals[min(lo + 1, len(vals) - 1)] - vals[lo]) * (pos - lo)
    got = algo.high_entropy_mask(ent, mask, q)
    for i in range(5):
        for t in range(7):
            assert got[i, t].item() == float(bool(mask[i, t]) and ent[i, t].item() >= thr)
    assert int(got.sum()) == math.ceil(q * len(vals)) or int(got.sum()) == round(q * len(vals))
    assert torch.equal(algo.high_entropy_mask(ent, mask, 1.0), mask)


def test_selective_log_softmax_and_entropy_match_the_full_softmax():
    torch.manual_seed(1)
    logits = torch.randn(5, 7, 11)
    idx = torch.randint(0, 11, (5, 7))
    expected = logits.log_softmax(-1).gather(-1, idx[..., None]).squeeze(-1)
    torch.testing.assert_close(selective_log_softmax(logits, idx, chunk_rows=2), expected, rtol=0, atol=1e-5)
    p = logits.softmax(-1)
    torch.testing.assert_close(token_entropy(logits, chunk_rows=3), -(p * p.log()).sum(-1), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# the registries


def test_every_registry_entry_is_documented():
    registries = {
        "OBJECTIVES": {k: v.fn for k, v in algo.OBJECTIVES.items()},
        "LOSS_AGGREGATIONS": {k: v.fn for k, v in algo.LOSS_AGGREGATIONS.items()},
        "IMPORTANCE_LEVELS": algo.IMPORTANCE_LEVELS,
        "KL_ESTIMATORS": algo.KL_ESTIMATORS,
        "SAMPLER_CORRECTIONS": algo.SAMPLER_CORRECTIONS,
        "ADVANTAGE_SCALES": algo.ADVANTAGE_SCALES,
        "REWARD_AGGREGATIONS": algo.REWARD_AGGREGATIONS,
        "GROUP_SIGNAL": algo.GROUP_SIGNAL,
    }
    for name, reg in registries.items():
        for key, fn in reg.items():
            assert fn.__doc__ and len(fn.__doc__.strip()) > 20, f"{name}[{key!r}] has no docstring"
    assert set(algo.IMPORTANCE_LEVELS) == {"token", "sequence"}
    assert set(algo.OBJECTIVES) == {"clip", "cispo", "sapo", "vespo"}
    assert set(algo.LOSS_AGGREGATIONS) == {*LOSS_TYPES, "luspo"}
    assert set(algo.LOSS_TYPES) == {*LOSS_TYPES, "cispo", "sapo", "vespo", "luspo"}  # TRL 1.16's loss_type values
    assert {o for o, _ in algo.LOSS_TYPES.values()} == set(algo.OBJECTIVES)  # every objective is reachable
    assert {a for _, a in algo.LOSS_TYPES.values()} == set(algo.LOSS_AGGREGATIONS)
    assert set(algo.SAMPLER_CORRECTIONS) == {"token_truncate", "token_mask", "sequence_truncate", "sequence_mask"}  # TRL's modes


def test_the_queries_follow_the_declared_properties():
    for loss_type, beta, coef in itertools.product(algo.LOSS_TYPES, [0.0, 0.04], [0.0, 0.01]):
        obj, agg = algo.OBJECTIVES[algo.LOSS_TYPES[loss_type].objective], algo.LOSS_AGGREGATIONS[algo.LOSS_TYPES[loss_type].aggregation]
        assert algo.rows_can_be_regrouped(loss_type) is (not agg.normalises_per_micro_batch)
        assert algo.zero_advantage_rows_have_zero_gradient(loss_type=loss_type, beta=beta, entropy_coef=coef) is (
            obj.zero_gradient_at_zero_advantage and beta == 0 and coef == 0 and not agg.normalises_per_micro_batch
        )
    assert [k for k, a in algo.LOSS_AGGREGATIONS.items() if a.normalises_per_micro_batch] == ["bnpo"]
    assert all(o.zero_gradient_at_zero_advantage for o in algo.OBJECTIVES.values())
    assert [k for k, o in algo.OBJECTIVES.items() if o.takes_sampler_weights] == ["vespo"]


def test_unknown_names_are_refused():
    x = torch.zeros(2, 3, dtype=D)
    n = BatchNorms(2, 6, 3)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        policy_loss(x, x, torch.zeros(2, dtype=D), x + 1, n, loss_type="gspo")
    with pytest.raises(ValueError, match="importance_level must be one of"):
        policy_loss(x, x, torch.zeros(2, dtype=D), x + 1, n, importance_level="seq")
    with pytest.raises(ValueError, match="beta > 0 needs ref_logp"):
        policy_loss(x, x, torch.zeros(2, dtype=D), x + 1, n, beta=0.1)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        algo.rows_can_be_regrouped("ppo")
    with pytest.raises(ValueError, match="loss_type must be one of"):
        algo.zero_advantage_rows_have_zero_gradient(loss_type="gspo", beta=0.0)
    with pytest.raises(ValueError, match="scale must be one of"):
        algo.group_advantages(torch.zeros(4), 2, scale="grouped")
