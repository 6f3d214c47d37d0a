"""Every GRPO variant in `rlvr.algo` against a reference written here as plain Python loops.

The references below loop over samples and tokens with Python floats and scalar torch ops (for
autograd); they share no code with the library. Inputs are random and ragged (several seeds,
padding filled with garbage that must be ignored, an empty row now and then), float64, and
loss values, gradients w.r.t. the log-probs and clip metrics must agree to 1e-10.
"""

import math
import random

import pytest
import torch

from rlvr import algo
from rlvr.algo import BatchNorms, combine_rewards, group_advantages, groups_with_signal, kl_estimate, policy_loss

D = torch.float64
TOL = dict(rtol=0, atol=1e-10)
SEEDS = [0, 1, 2]
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]


# ---------------------------------------------------------------------------------------------
# random ragged inputs


def ragged(seed, spread=0.3):
    rnd = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    N, L = rnd.randint(4, 7), rnd.randint(3, 9)
    lengths = [rnd.randint(1, L) for _ in range(N)]
    if seed % 2 == 0:
        lengths[rnd.randrange(N)] = 0  # an empty row (e.g. a masked truncated completion)
    mask = torch.zeros(N, L, dtype=D)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    logp = -3 * torch.rand(N, L, generator=g, dtype=D)  # padding holds garbage too
    old = logp + spread * torch.randn(N, L, generator=g, dtype=D)  # ratios on both sides of the clip range
    ref = logp + 0.5 * torch.randn(N, L, generator=g, dtype=D)
    adv = torch.randn(N, generator=g, dtype=D)
    adv[rnd.randrange(N)] = 0.0
    weights = (torch.rand(N, L, generator=g, dtype=D) > 0.4).to(D)  # a token selection, as top-entropy makes
    max_len = L + rnd.randint(0, 3)
    return logp, old, ref, adv, mask, weights, max_len


# ---------------------------------------------------------------------------------------------
# the loop reference


def ref_kl(lp, rlp, est):
    x = rlp - lp  # log(p_ref / p)
    if est == "k1":
        return -x
    if est == "k2":
        return x * x / 2
    return torch.exp(x) - x - 1


def _val(x):
    return x.item() if torch.is_tensor(x) else x


def ref_policy_loss(logp, old, adv, mask, *, loss_type, epsilon, epsilon_high=None, delta=None, level="token",
                    beta=0.0, ref=None, est="k3", weights=None, num_sequences, num_tokens, max_len, num_micro=1):
    """Returns (loss, low_frac, high_frac, region_frac, kl_mean); logp is a leaf tensor, the rest lists."""
    old, adv, mask = old.tolist(), adv.tolist(), mask.tolist()
    ref = ref.tolist() if ref is not None else None
    weights = weights.tolist() if weights is not None else None
    hi_eps = epsilon if epsilon_high is None else epsilon_high
    N, L = len(mask), len(mask[0])
    row_sums, row_counts = [], []
    n_low = n_high = n_region = n_tok = 0
    kl_sum = 0.0
    for i in range(N):
        toks = [t for t in range(L) if mask[i][t] == 1.0]
        seq_lr = None
        if level == "sequence":
            acc = 0.0
            for t in toks:
                acc = acc + (logp[i, t] - old[i][t])
            seq_lr = acc / len(toks) if toks else torch.zeros((), dtype=D)
        row = torch.zeros((), dtype=D)
        for t in toks:
            lr = logp[i, t] - old[i][t] if level == "token" else seq_lr
            r = torch.exp(lr)
            rv = r.item()
            if rv < 1 - epsilon:
                rc = 1 - epsilon
            elif rv > 1 + hi_eps:
                rc = 1 + hi_eps
            else:
                rc = r
            capped = delta if (delta is not None and rv > delta) else r
            a, b = capped * adv[i], rc * adv[i]
            term = -(a if _val(a) <= _val(b) else b)
            if weights is not None:
                term = term * weights[i][t]
            if beta:
                k = ref_kl(logp[i, t], ref[i][t], est)
                term = term + beta * k
                kl_sum += k.item()
            row = row + term
            low = rv < 1 - epsilon and adv[i] < 0
            high = rv > 1 + hi_eps and adv[i] > 0
            n_low += low
            n_high += high
            n_region += low or high
            n_tok += 1
        row_sums.append(row)
        row_counts.append(len(toks))
    if loss_type == "grpo":
        loss = sum(s / c if c else s * 0 for s, c in zip(row_sums, row_counts)) / num_sequences
    elif loss_type == "bnpo":
        loss = sum(row_sums) / max(sum(row_counts), 1) / num_micro
    elif loss_type == "dr_grpo":
        loss = sum(row_sums) / (num_sequences * max_len)
    elif loss_type == "dapo":
        loss = sum(row_sums) / num_tokens
    else:
        raise AssertionError(loss_type)
    d = max(n_tok, 1)
    return loss, n_low / d, n_high / d, n_region / d, kl_sum / d


def norms_of(mask, max_len, num_micro=1):
    return BatchNorms(num_sequences=mask.shape[0], num_tokens=int(mask.sum()), max_completion_length=max_len,
                      num_micro_batches=num_micro)


SETUPS = {
    "ppo_clip": dict(epsilon=0.2),
    "clip_higher": dict(epsilon=0.2, epsilon_high=0.28),
    "delta": dict(epsilon=0.2, delta=1.3),
    "kl_k1": dict(epsilon=0.2, beta=0.04, est="k1"),
    "kl_k2": dict(epsilon=0.2, epsilon_high=0.28, beta=0.1, est="k2"),
    "kl_k3_top_entropy": dict(epsilon=0.2, beta=0.04, est="k3", weights=True),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_policy_loss_matches_loop_reference(loss_type, level, setup, seed):
    logp, old, ref, adv, mask, weights, max_len = ragged(seed)
    kw = dict(SETUPS[setup])
    use_w = kw.pop("weights", False)
    est = kw.pop("est", "k3")
    beta = kw.pop("beta", 0.0)

    lp_lib = logp.clone().requires_grad_(True)
    out = policy_loss(lp_lib, old, adv, mask, norms_of(mask, max_len), loss_type=loss_type, importance_level=level,
                      beta=beta, ref_logp=ref if beta else None, kl_estimator=est,
                      token_weights=weights if use_w else None, **kw)
    out.loss.backward()

    lp_ref = logp.clone().requires_grad_(True)
    loss, low, high, region, kl = ref_policy_loss(
        lp_ref, old, adv, mask, loss_type=loss_type, level=level, beta=beta, ref=ref, est=est,
        weights=weights if use_w else None, num_sequences=mask.shape[0], num_tokens=int(mask.sum()), max_len=max_len, **kw,
    )
    loss.backward()

    torch.testing.assert_close(out.loss.detach(), loss.detach(), **TOL)
    torch.testing.assert_close(lp_lib.grad, lp_ref.grad, **TOL)
    assert out.low_clipped.item() == pytest.approx(low, abs=1e-12)
    assert out.high_clipped.item() == pytest.approx(high, abs=1e-12)
    assert out.region_clipped.item() == pytest.approx(region, abs=1e-12)
    if beta:
        assert out.kl.item() == pytest.approx(kl, abs=1e-10)
    else:
        assert out.kl is None


def test_loop_reference_gradient_agrees_with_finite_differences():
    """The reference itself is checked once against central differences (it is what the library is held to)."""
    logp, old, ref, adv, mask, weights, max_len = ragged(1)
    kw = dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, level="token", beta=0.04, ref=ref, est="k3",
              num_sequences=mask.shape[0], num_tokens=int(mask.sum()), max_len=max_len)
    lp = logp.clone().requires_grad_(True)
    ref_policy_loss(lp, old, adv, mask, **kw)[0].backward()
    h = 1e-6
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            up, down = logp.clone(), logp.clone()
            up[i, t] += h
            down[i, t] -= h
            fd = (ref_policy_loss(up, old, adv, mask, **kw)[0] - ref_policy_loss(down, old, adv, mask, **kw)[0]).item() / (2 * h)
            assert lp.grad[i, t].item() == pytest.approx(fd, abs=1e-6)


# ---------------------------------------------------------------------------------------------
# gradient accumulation


def _accumulate(logp, old, ref, adv, mask, cuts, max_len, **kw):
    """Sum of micro-batch losses and gradients, each micro-batch trimmed to its own longest row (as the trainer)."""
    lp = logp.clone().requires_grad_(True)
    norms = norms_of(mask, max_len, num_micro=len(cuts) - 1)
    total = 0.0
    for a, b in zip(cuts, cuts[1:]):
        C = max(int(mask[a:b].sum(-1).max()), 1)
        out = policy_loss(lp[a:b, :C], old[a:b, :C], adv[a:b], mask[a:b, :C], norms,
                          ref_logp=ref[a:b, :C] if kw.get("beta") else None, **kw)
        out.loss.backward()
        total += out.loss.item()
    return total, lp.grad


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_micro_batches_give_the_full_batch_loss_and_gradient(loss_type, level, seed):
    logp, old, ref, adv, mask, _, max_len = ragged(seed)
    kw = dict(loss_type=loss_type, importance_level=level, epsilon=0.2, epsilon_high=0.28, beta=0.04)
    full_loss, full_grad = _accumulate(logp, old, ref, adv, mask, [0, mask.shape[0]], max_len, **kw)
    N = mask.shape[0]
    for cuts in ([0, 1, N], [0, 2, 3, N], [0, *range(1, N), N]):  # uneven pieces, down to one row each
        loss, grad = _accumulate(logp, old, ref, adv, mask, list(cuts), max_len, **kw)
        assert loss == pytest.approx(full_loss, abs=1e-12)
        torch.testing.assert_close(grad, full_grad, **TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_dapo_normaliser_is_the_full_batch_token_count_not_the_micro_batch(seed):
    logp, old, ref, adv, mask, _, max_len = ragged(seed)
    lp = logp.clone().requires_grad_(True)
    norms = norms_of(mask, max_len, num_micro=2)
    out = policy_loss(lp[:2], logp[:2], adv[:2], mask[:2], norms, loss_type="dapo")  # ratio 1
    out.loss.backward()
    expected = -(adv[:2, None] * mask[:2]) / mask.sum()  # / all tokens of the batch, not mask[:2].sum()
    torch.testing.assert_close(lp.grad[:2], expected, **TOL)


def test_bnpo_is_the_mean_of_local_token_means():
    """bnpo normalises by each micro-batch's own tokens (its definition), so it is not split-invariant."""
    logp, old, ref, adv, mask, _, max_len = ragged(3)
    cuts = [0, 2, mask.shape[0]]
    loss, _ = _accumulate(logp, old, ref, adv, mask, cuts, max_len, loss_type="bnpo", epsilon=0.2)
    expected = 0.0
    for a, b in zip(cuts, cuts[1:]):
        lp = logp[a:b].clone().requires_grad_(True)
        expected += ref_policy_loss(lp, old[a:b], adv[a:b], mask[a:b], loss_type="bnpo", epsilon=0.2, num_sequences=0,
                                    num_tokens=0, max_len=max_len, num_micro=2)[0].item()
    assert loss == pytest.approx(expected, abs=1e-12)


# ---------------------------------------------------------------------------------------------
# the clipped objective's gradient, case by case


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_at_ratio_one_the_gradient_is_that_of_advantage_weighted_log_likelihood(loss_type, level):
    logp, _, _, adv, mask, _, max_len = ragged(4)
    N = mask.shape[0]
    lp = logp.clone().requires_grad_(True)
    out = policy_loss(lp, logp, adv, mask, norms_of(mask, max_len), loss_type=loss_type, importance_level=level)
    out.loss.backward()
    # d/dlogp_it of -sum_i c_i * A_i * sum_t logp_it, with c_i the aggregation's weight of row i
    expected = torch.zeros_like(logp)
    for i in range(N):
        n_i = int(mask[i].sum())
        c = {"grpo": 1 / (max(n_i, 1) * N), "bnpo": 1 / mask.sum().item(), "dr_grpo": 1 / (N * max_len),
             "dapo": 1 / mask.sum().item()}[loss_type]
        for t in range(n_i):
            expected[i, t] = -c * adv[i].item()
    torch.testing.assert_close(lp.grad, expected, **TOL)
    assert out.region_clipped.item() == 0.0


def _one_token_rows(ratios, advs):
    old = torch.zeros(len(ratios), 1, dtype=D)
    lp = torch.log(torch.tensor(ratios, dtype=D))[:, None].requires_grad_(True)
    mask = torch.ones(len(ratios), 1, dtype=D)
    return lp, old, torch.tensor(advs, dtype=D), mask


def test_clip_zeroes_the_gradient_only_on_the_side_the_advantage_pushes():
    # A>0 past 1+eps, A<0 below 1-eps: clipped. A>0 below 1-eps, A<0 above 1+eps: not (the min keeps the worse).
    ratios, advs = [1.5, 0.5, 0.5, 1.5, 1.1], [1.0, -1.0, 1.0, -1.0, 2.0]
    lp, old, adv, mask = _one_token_rows(ratios, advs)
    out = policy_loss(lp, old, adv, mask, norms_of(mask, 1), loss_type="dapo", epsilon=0.2)
    out.loss.backward()
    T = 5
    expected_grad = [0.0, 0.0, -1.0 * 0.5 / T, 1.0 * 1.5 / T, -2.0 * 1.1 / T]  # d(-r A)/dlogp = -r A
    torch.testing.assert_close(lp.grad[:, 0], torch.tensor(expected_grad, dtype=D), **TOL)
    expected_loss = (-1.2 * 1.0 + -0.8 * -1.0 + -0.5 * 1.0 + -1.5 * -1.0 + -1.1 * 2.0) / T
    assert out.loss.item() == pytest.approx(expected_loss, abs=1e-12)
    assert out.high_clipped.item() == pytest.approx(1 / 5)
    assert out.low_clipped.item() == pytest.approx(1 / 5)
    assert out.region_clipped.item() == pytest.approx(2 / 5)


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
    out = policy_loss(logp, old, adv, mask, norms_of(mask, 4), loss_type="dapo", importance_level="sequence",
                      epsilon=0.2)
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
    out = policy_loss(logp, torch.zeros(1, 3, dtype=D), torch.ones(1, dtype=D), mask, norms_of(mask, 3),
                      importance_level="sequence", epsilon=0.2)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-1.2, abs=1e-12)
    assert torch.all(logp.grad == 0)
    assert out.high_clipped.item() == 1.0


# ---------------------------------------------------------------------------------------------
# truncated completions


def test_masked_truncated_completions_leave_the_loss():
    logp, old, ref, adv, mask, _, max_len = ragged(5)
    truncated = torch.zeros(mask.shape[0], dtype=torch.bool)
    truncated[[0, 2]] = True
    m = algo.mask_truncated(mask, truncated)
    for i in range(mask.shape[0]):
        assert torch.equal(m[i], torch.zeros_like(mask[i]) if i in (0, 2) else mask[i])
    lp = logp.clone().requires_grad_(True)
    out = policy_loss(lp, old, adv, m, norms_of(m, max_len), loss_type="dapo", epsilon=0.2)
    out.loss.backward()
    assert torch.all(lp.grad[[0, 2]] == 0)
    keep = [i for i in range(mask.shape[0]) if i not in (0, 2)]
    lp2 = logp[keep].clone().requires_grad_(True)
    ref_loss = ref_policy_loss(lp2, old[keep], adv[keep], mask[keep], loss_type="dapo", epsilon=0.2,
                               num_sequences=len(keep), num_tokens=int(mask[keep].sum()), max_len=max_len)[0]
    assert out.loss.item() == pytest.approx(ref_loss.item(), abs=1e-12)  # normaliser: the kept tokens only


# ---------------------------------------------------------------------------------------------
# KL estimators


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


# ---------------------------------------------------------------------------------------------
# advantages


def ref_advantages(rewards, G, scale, ddof, eps=1e-8):
    r = rewards.tolist()
    out = []
    allv = [v for v in r if not math.isnan(v)]
    bm = sum(allv) / len(allv)
    bstd = math.sqrt(sum((v - bm) ** 2 for v in allv) / max(len(allv) - ddof, 1))
    for g0 in range(0, len(r), G):
        grp = [v for v in r[g0:g0 + G] if not math.isnan(v)]
        m = sum(grp) / len(grp) if grp else 0.0
        sd = math.sqrt(sum((v - m) ** 2 for v in grp) / max(len(grp) - ddof, 1)) if grp else 0.0
        div = {"group": sd + eps, "batch": bstd + eps, "none": 1.0}[scale]
        out += [0.0 if math.isnan(v) else (v - m) / div for v in r[g0:g0 + G]]
    return torch.tensor(out, dtype=D)


def test_seeds_worked_example():
    adv = group_advantages(torch.tensor([0.8, 0.3, 0.6, 0.3], dtype=D), 4)
    assert [round(a, 2) for a in adv.tolist()] == [1.41, -0.94, 0.47, -0.94]
    std = math.sqrt((0.3**2 + 0.2**2 + 0.1**2 + 0.2**2) / 4)  # population std, ~0.2121
    torch.testing.assert_close(adv, torch.tensor([0.3, -0.2, 0.1, -0.2], dtype=D) / (std + 1e-8), **TOL)
    assert group_advantages(torch.full((4,), 0.7, dtype=D), 4).abs().max().item() == 0.0
    sample = group_advantages(torch.tensor([0.8, 0.3, 0.6, 0.3], dtype=D), 4, ddof=1)  # TRL's torch.std
    assert [round(a, 2) for a in sample.tolist()] == [1.22, -0.82, 0.41, -0.82]  # as docs/algorithms.md says


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_match_loop_reference(scale, ddof, seed):
    g = torch.Generator().manual_seed(seed)
    G = 4
    rewards = torch.randint(0, 3, (5 * G,), generator=g).to(D) / 2  # ties and equal groups happen
    rewards[:G] = 0.5  # one zero-variance group
    rewards[G + 1] = float("nan")  # one "not applicable"
    got = group_advantages(rewards, G, scale=scale, ddof=ddof)
    torch.testing.assert_close(got, ref_advantages(rewards, G, scale, ddof), **TOL)
    assert got[:G].abs().max().item() == 0.0


def ref_combine(rewards, weights, G, mode, scale, ddof, eps=1e-8):
    rows, K = rewards.tolist(), len(weights)
    if mode == "sum_then_normalize":
        tot = []
        for row in rows:
            vals = [w * v for w, v in zip(weights, row) if not math.isnan(v)]
            tot.append(sum(vals) if vals else float("nan"))
        return ref_advantages(torch.tensor(tot, dtype=D), G, scale, ddof, eps)
    cols = [ref_advantages(torch.tensor([row[k] for row in rows], dtype=D), G, scale, ddof, eps).tolist() for k in range(K)]
    s = [sum(weights[k] * cols[k][i] for k in range(K)) for i in range(len(rows))]
    if scale == "none":
        return torch.tensor(s, dtype=D)
    m = sum(s) / len(s)
    sd = math.sqrt(sum((v - m) ** 2 for v in s) / max(len(s) - ddof, 1))
    return torch.tensor([(v - m) / (sd + eps) for v in s], dtype=D)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("mode", ["sum_then_normalize", "normalize_then_sum"])
def test_multi_reward_modes_match_loop_reference(mode, scale, seed):
    g = torch.Generator().manual_seed(seed)
    G, K = 4, 3
    rewards = torch.randint(0, 2, (4 * G, K), generator=g).to(D)
    rewards[:, 2] = torch.rand(4 * G, generator=g, dtype=D)  # a partial-credit reward
    rewards[3, 1] = float("nan")
    rewards[5] = float("nan")  # every function said "not applicable" for one completion
    weights = [1.0, 0.5, 2.0]
    got = combine_rewards(rewards, torch.tensor(weights), G, mode=mode, scale=scale, ddof=0)
    torch.testing.assert_close(got, ref_combine(rewards, weights, G, mode, scale, 0), **TOL)


def test_normalize_then_sum_keeps_combinations_apart_that_sum_then_normalize_merges():
    """GDPO's motivating case: rewards (0,0) vs (1,0), and (0,0) vs (1,1), give the same advantages
    once summed and normalised; decoupled normalisation keeps the second pair twice as far apart."""
    rewards = torch.tensor([[0, 0], [1, 0], [0, 0], [1, 1]], dtype=D)  # two groups of G=2
    w = torch.tensor([1.0, 1.0])
    summed = combine_rewards(rewards, w, 2, mode="sum_then_normalize")
    torch.testing.assert_close(summed[:2], summed[2:], rtol=0, atol=1e-7)  # (eps differs: std 0.5 vs 1)
    decoupled = combine_rewards(rewards, w, 2, mode="normalize_then_sum")
    torch.testing.assert_close(decoupled[2:], 2 * decoupled[:2], **TOL)
    s = torch.tensor([-1.0, 1.0, -2.0, 2.0], dtype=D)  # per-group sums of per-reward advantages (+-1 each)
    torch.testing.assert_close(decoupled, s / (s.std(correction=0) + 1e-8), rtol=0, atol=1e-6)


def test_groups_with_signal_per_mode():
    G = 2
    rewards = torch.tensor([
        [1, 0], [1, 0],  # group 0: identical -> no signal
        [1, 0], [0, 2],  # group 1: weighted sums tie, components differ
        [1, 0], [0, 0],  # group 2: differ
        [1, float("nan")], [float("nan"), float("nan")],  # group 3: one valid completion only
    ], dtype=D)
    w = torch.tensor([1.0, 0.5])
    assert groups_with_signal(rewards, w, G, mode="sum_then_normalize").tolist() == [False, False, True, False]
    assert groups_with_signal(rewards, w, G, mode="normalize_then_sum").tolist() == [False, True, True, False]
    assert group_advantages(torch.tensor([0.1, 0.1, 0.1], dtype=D), 3).abs().max().item() == 0.0  # not 1e-9
    for mode in ("sum_then_normalize", "normalize_then_sum"):  # consistent with the advantages
        adv = combine_rewards(rewards, w, G, mode=mode).view(-1, G)
        sig = groups_with_signal(rewards, w, G, mode=mode)
        assert ((adv.abs().amax(-1) > 1e-6) == sig).all(), mode


# ---------------------------------------------------------------------------------------------
# high-entropy tokens (80/20)


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
