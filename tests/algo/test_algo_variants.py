"""Every policy-loss variant in `rlvr.algo` against a reference written here as plain Python loops,
and the fast-path properties the registries declare, checked on the numbers.

The reference loops over samples and tokens with Python floats and scalar torch ops (for autograd);
it shares no code with the library. Inputs are random and ragged (several seeds, padding filled
with garbage that must be ignored, an empty row now and then), float64, and loss values, gradients
w.r.t. the log-probs and clip metrics must agree to 1e-10. (Advantages: test_algo_advantages.py;
hand-computed cases and the registries' declarations: test_algo_losses.py.)
"""

import random

import pytest
import torch

from rlvr import algo
from rlvr.algo import BatchNorms, policy_loss

D = torch.float64
TOL = dict(rtol=0, atol=1e-10)
SEEDS = [0, 1, 2]
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]
LEVELS = ["token", "sequence"]


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


def norms_of(mask, max_len, num_micro=1):
    return BatchNorms(num_sequences=mask.shape[0], num_tokens=int(mask.sum()), max_completion_length=max_len, num_micro_batches=num_micro)


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


def ref_policy_loss(
    logp,
    old,
    adv,
    mask,
    *,
    loss_type,
    epsilon,
    epsilon_high=None,
    delta=None,
    level="token",
    beta=0.0,
    ref=None,
    est="k3",
    weights=None,
    num_sequences,
    num_tokens,
    max_len,
    num_micro=1,
):
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
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_policy_loss_matches_loop_reference(loss_type, level, setup, seed):
    logp, old, ref, adv, mask, weights, max_len = ragged(seed)
    kw = dict(SETUPS[setup])
    use_w = kw.pop("weights", False)
    est = kw.pop("est", "k3")
    beta = kw.pop("beta", 0.0)

    lp_lib = logp.clone().requires_grad_(True)
    out = policy_loss(
        lp_lib,
        old,
        adv,
        mask,
        norms_of(mask, max_len),
        loss_type=loss_type,
        importance_level=level,
        beta=beta,
        ref_logp=ref if beta else None,
        kl_estimator=est,
        token_weights=weights if use_w else None,
        **kw,
    )
    out.loss.backward()

    lp_ref = logp.clone().requires_grad_(True)
    loss, low, high, region, kl = ref_policy_loss(
        lp_ref,
        old,
        adv,
        mask,
        loss_type=loss_type,
        level=level,
        beta=beta,
        ref=ref,
        est=est,
        weights=weights if use_w else None,
        num_sequences=mask.shape[0],
        num_tokens=int(mask.sum()),
        max_len=max_len,
        **kw,
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
    kw = dict(
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        level="token",
        beta=0.04,
        ref=ref,
        est="k3",
        num_sequences=mask.shape[0],
        num_tokens=int(mask.sum()),
        max_len=max_len,
    )
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
    ref_loss = ref_policy_loss(
        lp2,
        old[keep],
        adv[keep],
        mask[keep],
        loss_type="dapo",
        epsilon=0.2,
        num_sequences=len(keep),
        num_tokens=int(mask[keep].sum()),
        max_len=max_len,
    )[0]
    assert out.loss.item() == pytest.approx(ref_loss.item(), abs=1e-12)  # normaliser: the kept tokens only


# ---------------------------------------------------------------------------------------------
# gradient accumulation, regrouping and skipping rows: what the registries declare, on the numbers


def _accumulate(logp, old, ref, adv, mask, chunks, norms, **kw):
    """Sum of the losses and gradients of micro-batches of the given rows, each trimmed to its own longest row (as the trainer)."""
    lp = logp.clone().requires_grad_(True)
    total = 0.0
    for rows in chunks:
        rows = torch.as_tensor(rows)
        C = max(int(mask[rows].sum(-1).max()), 1)
        out = policy_loss(
            lp[rows, :C], old[rows, :C], adv[rows], mask[rows, :C], norms, ref_logp=ref[rows, :C] if kw.get("beta") else None, **kw
        )
        out.loss.backward()
        total += out.loss.item()
    return total, lp.grad


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_micro_batches_of_any_rows_give_the_full_batch_loss_exactly_when_rows_can_be_regrouped(loss_type, level, seed):
    logp, old, ref, adv, mask, _, max_len = ragged(seed)
    N = mask.shape[0]
    kw = dict(loss_type=loss_type, importance_level=level, epsilon=0.2, epsilon_high=0.28, beta=0.04)
    full_loss, full_grad = _accumulate(logp, old, ref, adv, mask, [range(N)], norms_of(mask, max_len), **kw)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(seed)).tolist()
    splits = (
        [[0], range(1, N)],
        [[0, 1], [2], range(3, N)],
        [[i] for i in range(N)],  # uneven, down to one row each
        [perm[: N // 2], perm[N // 2 :]],
        [perm[:1], perm[1:]],
    )  # rows in any order and grouping
    changed = []
    for chunks in splits:
        loss, grad = _accumulate(logp, old, ref, adv, mask, chunks, norms_of(mask, max_len, len(chunks)), **kw)
        if algo.rows_can_be_regrouped(loss_type):
            assert loss == pytest.approx(full_loss, abs=1e-12)
            torch.testing.assert_close(grad, full_grad, **TOL)
        changed.append(abs(loss - full_loss) > 1e-6 and (grad - full_grad).abs().max().item() > 1e-6)
    # bnpo: each micro-batch's own token count (equal whenever the pieces hold equal token counts)
    assert any(changed) is not algo.rows_can_be_regrouped(loss_type)


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
    chunks = [range(2), range(2, mask.shape[0])]
    loss, _ = _accumulate(logp, old, ref, adv, mask, chunks, norms_of(mask, max_len, 2), loss_type="bnpo", epsilon=0.2)
    expected = 0.0
    for rows in chunks:
        lp = logp[rows].clone().requires_grad_(True)
        expected += ref_policy_loss(
            lp, old[rows], adv[rows], mask[rows], loss_type="bnpo", epsilon=0.2, num_sequences=0, num_tokens=0, max_len=max_len, num_micro=2
        )[0].item()
    assert loss == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("beta, weighted", [(0.0, False), (0.0, True), (0.04, False)])
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_zero_advantage_rows_can_be_left_out_exactly_when_the_registries_say_so(loss_type, level, beta, weighted, seed):
    """Gradient of the summed loss with every row vs without the rows whose advantage is exactly 0
    (BatchNorms of the whole batch either way), set against zero_advantage_rows_have_zero_gradient."""
    logp, old, ref, adv, mask, weights, max_len = ragged(seed)
    N = mask.shape[0]
    adv[int(mask.sum(-1).argmax())] = 0.0  # a row with tokens and advantage exactly 0 (besides ragged's)
    zero = (adv == 0).nonzero().squeeze(-1)
    keep = (adv != 0).nonzero().squeeze(-1)
    norms = norms_of(mask, max_len)
    kw = dict(loss_type=loss_type, importance_level=level, epsilon=0.2, epsilon_high=0.28, delta=1.3, beta=beta)
    grads, losses = [], []
    for rows in (torch.arange(N), keep):
        lp = logp.clone().requires_grad_(True)
        if weighted:
            kw["token_weights"] = weights[rows]
        out = policy_loss(lp[rows], old[rows], adv[rows], mask[rows], norms, ref_logp=ref[rows] if beta else None, **kw)
        out.loss.backward()
        grads.append(lp.grad)
        losses.append(out.loss.item())
    assert grads[0][keep].abs().max() > 1e-3  # the other rows do learn something
    declared = algo.OBJECTIVES[algo.LOSS_TYPES[loss_type].objective].zero_gradient_at_zero_advantage
    assert declared and bool((grads[0][zero] == 0).all()) == (beta == 0)  # KL: gradient at A = 0
    if algo.zero_advantage_rows_have_zero_gradient(loss_type=loss_type, beta=beta):
        torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-12)
        assert losses[1] == pytest.approx(losses[0], abs=1e-12)
    else:
        assert (grads[1] - grads[0]).abs().max() > 1e-6
