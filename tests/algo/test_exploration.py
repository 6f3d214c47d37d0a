"""The adaptive entropy controller against a hand-written loop of TRL 1.16's rule, and Clip-Cov / KL-Cov against a
transcription of verl's compute_policy_loss_clip_cov / _kl_cov (core_algos.py), in float64."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algo.exploration import (
    applied_entropy_coef,
    clip_cov_weights,
    kl_cov_penalty,
    kl_cov_selection,
    next_entropy_control,
    start_entropy_control,
    token_covariance,
)

D = torch.float64


def trl_controller(entropies, *, coef, target, delta, lo, hi):
    """TRL's GRPOTrainer._compute_loss, adaptive branch: the coefficient applied at each step, then its update."""
    entropy_coef, last = coef, float("inf")
    applied = []
    for h in entropies:
        applied.append(entropy_coef if last <= target else 0.0)
        if h <= target:
            entropy_coef = min(entropy_coef + delta, hi)
        else:
            entropy_coef = max(entropy_coef - delta, lo)
        last = h
    return applied, entropy_coef, last


@pytest.mark.parametrize("seed", range(5))
def test_the_controller_follows_trls_rule(seed):
    g = torch.Generator().manual_seed(seed)
    entropies = (0.4 * torch.rand(40, generator=g, dtype=D)).tolist()  # around the target, both sides
    kw = dict(delta=0.005 * (seed + 1), coef_min=0.001 * seed, coef_max=0.03)
    state, applied = start_entropy_control(0.01, target=0.2), []
    for h in entropies:
        applied.append(applied_entropy_coef(state))
        state = next_entropy_control(state, h, **kw)
    expected, coef, last = trl_controller(entropies, coef=0.01, target=0.2, delta=kw["delta"], lo=kw["coef_min"], hi=kw["coef_max"])
    assert applied == expected and state == (coef, last, 0.2, ())
    assert applied[0] == 0.0 and math.isinf(start_entropy_control(0.5, target=0.2).last_entropy)  # nothing before a measurement


@pytest.mark.parametrize("seed", range(4))
def test_the_automatic_target_is_half_the_first_five_steps_then_trls_rule(seed):
    g = torch.Generator().manual_seed(seed)
    entropies = (0.3 + 0.5 * torch.rand(60, generator=g, dtype=D)).tolist()
    entropies[20:] = [0.5 * h for h in entropies[20:]]  # falls below half the start: the coefficient must engage
    kw = dict(delta=0.01, coef_min=0.0, coef_max=0.08)
    state, applied = start_entropy_control(0.02, target=None), []
    for h in entropies:
        applied.append(applied_entropy_coef(state))
        state = next_entropy_control(state, h, **kw)
    target = 0.5 * sum(entropies[:5]) / 5
    # by hand: nothing moves or applies for 4 steps, then TRL's rule from step 5 on with that target
    expected, coef, last = trl_controller(entropies[4:], coef=0.02, target=target, delta=0.01, lo=0.0, hi=0.08)
    assert applied == [0.0] * 4 + expected  # TRL's loop starts with nothing measured: no bonus at step 5 either
    assert state.target == pytest.approx(target, rel=1e-15) and (state.coef, state.last_entropy) == (coef, last)
    assert max(applied) > 0  # the scenario did engage


def inputs(seed):
    g = torch.Generator().manual_seed(seed)
    N, L = 7, 9
    mask = torch.zeros(N, L, dtype=D)
    for i in range(N):
        mask[i, : 1 + (i * 5 + seed) % L] = 1
    logp = -3 * torch.rand(N, L, generator=g, dtype=D)
    old = logp + 0.2 * torch.randn(N, L, generator=g, dtype=D)
    adv = torch.randn(N, generator=g, dtype=D)
    return logp, old, adv, mask


def masked_mean(x, m):
    return (x * m).sum() / m.sum()


def verl_clip_cov(log_prob, old_log_prob, advantages, response_mask, *, clip_ratio, lb, ub, cliprange=0.2, perm):
    """verl's compute_policy_loss_clip_cov up to the corrected per-token losses (advantages per token, [N, L])."""
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange, 1 + cliprange)
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
    cov_all = (advantages - masked_mean(advantages, response_mask)) * (log_prob - masked_mean(log_prob.detach(), response_mask))
    cov_all[response_mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_ratio * response_mask.sum().item()), 1)
    top_k_idx = (cov_all < ub) & (cov_all > lb) & (response_mask > 0)
    top_k_idx = torch.nonzero(top_k_idx)
    if len(top_k_idx) > 0:
        top_k_idx = top_k_idx[perm(len(top_k_idx))[: min(clip_num, len(top_k_idx))]]
    corr = torch.ones_like(advantages)
    corr[top_k_idx[:, 0], top_k_idx[:, 1]] = 0
    return torch.maximum(pg_losses1, pg_losses2) * corr, clip_by_origin


def verl_kl_cov(log_prob, old_log_prob, advantages, response_mask, *, kl_cov_ratio, ppo_kl_coef):
    """verl's compute_policy_loss_kl_cov up to the per-token losses."""
    negative_approx_kl = log_prob - old_log_prob
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl
    pg_losses = pg_losses1.clone()
    all_valid = response_mask > 0
    all_valid_idx = torch.nonzero(all_valid.reshape(-1), as_tuple=True)[0]
    all_valid_adv = advantages[all_valid].detach().reshape(-1).cpu()
    all_valid_logp = log_prob[all_valid].detach().reshape(-1).cpu()
    cov_lst_all = (all_valid_adv - all_valid_adv.mean()) * (all_valid_logp - all_valid_logp.mean())
    k_percent_nums = max(1, int(len(cov_lst_all) * kl_cov_ratio))
    large_cov_idxs = torch.topk(cov_lst_all, k_percent_nums, largest=True).indices
    large_cov_idxs = all_valid_idx[large_cov_idxs]
    rows, cols = large_cov_idxs // advantages.shape[1], large_cov_idxs % advantages.shape[1]
    pg_losses[rows, cols] = pg_losses_kl[rows, cols]
    return pg_losses


@pytest.mark.parametrize("seed", range(5))
def test_clip_cov_detaches_the_tokens_verl_does(seed):
    logp, old, adv, mask = inputs(seed)
    per_token_adv = adv.unsqueeze(1).expand_as(logp).clone()
    draws = {}

    def perm(n):  # the same random draw on both sides
        draws[n] = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        return draws[n]

    kw = dict(clip_ratio=0.1, lb=-0.05, ub=0.5)
    lp_verl = logp.clone().requires_grad_(True)
    verl_losses, clipped = verl_clip_cov(lp_verl, old, per_token_adv, mask, clip_ratio=0.1, lb=-0.05, ub=0.5, perm=perm)
    (verl_losses * mask).sum().backward()

    lp = logp.clone().requires_grad_(True)
    w = clip_cov_weights(
        lp, adv, mask, ratio=kw["clip_ratio"], lower=kw["lb"], upper=kw["ub"], already_clipped=clipped,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    ratio = torch.exp(lp - old)
    ours = torch.maximum(-per_token_adv * ratio, -per_token_adv * torch.clamp(ratio, 0.8, 1.2)) * w
    (ours * mask).sum().backward()
    assert 0 < int((w == 0).sum()) <= max(int(0.1 * mask.sum()), 1)  # at most ratio x tokens, drawn among the eligible
    torch.testing.assert_close(ours, verl_losses, rtol=0, atol=1e-12)
    torch.testing.assert_close(lp.grad, lp_verl.grad, rtol=0, atol=1e-12)
    assert (w == 0).any()


@pytest.mark.parametrize("seed", range(5))
def test_kl_cov_penalises_the_tokens_verl_does(seed):
    logp, old, adv, mask = inputs(seed)
    per_token_adv = adv.unsqueeze(1).expand_as(logp).clone()
    lp_verl = logp.clone().requires_grad_(True)
    verl_losses = verl_kl_cov(lp_verl, old, per_token_adv, mask, kl_cov_ratio=0.05, ppo_kl_coef=1.0)
    (verl_losses * mask).sum().backward()

    lp = logp.clone().requires_grad_(True)
    selected = kl_cov_selection(lp, adv, mask, ratio=0.05)
    ours = -per_token_adv * torch.exp(lp - old) + kl_cov_penalty(lp, old, selected, coef=1.0)
    (ours * mask).sum().backward()
    assert int(selected.sum()) == max(1, int(mask.sum() * 0.05))
    torch.testing.assert_close(ours * mask, verl_losses * mask, rtol=0, atol=1e-12)
    torch.testing.assert_close(lp.grad, lp_verl.grad, rtol=0, atol=1e-12)


def test_covariance_is_centred_over_the_masks_tokens_only():
    logp, _, adv, mask = inputs(0)
    cov = token_covariance(logp, adv, mask)
    assert float(cov[mask == 0].abs().sum()) == 0.0
    a = adv.unsqueeze(1).expand_as(logp)
    expected = (logp - masked_mean(logp, mask)) * (a - masked_mean(a, mask)) * mask
    torch.testing.assert_close(cov, expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("seed", range(3))
def test_clip_cov_leaves_the_entropy_bonus_on_every_token(seed):
    """Clip-Cov zeroes the policy-gradient term of its tokens (policy_loss's token_weights); the entropy bonus still
    averages over every loss token (entropy_weights), as verl's entropy loss does over the response mask."""
    from rlvr.algo import BatchNorms, policy_loss

    logp, old, adv, mask = inputs(seed)
    H = 2 * torch.rand(logp.shape, generator=torch.Generator().manual_seed(seed), dtype=D)
    w = clip_cov_weights(logp, adv, mask, ratio=0.3, lower=-1e9, upper=1e9, generator=torch.Generator().manual_seed(seed))
    norms = BatchNorms(num_sequences=logp.shape[0], num_tokens=int(mask.sum()), max_completion_length=logp.shape[1])
    kw = dict(loss_type="dapo", epsilon=0.2, token_weights=w)
    no_bonus = policy_loss(logp, old, adv, mask, norms, **kw).loss
    with_bonus = policy_loss(logp, old, adv, mask, norms, **kw, entropy=H, entropy_coef=0.1, entropy_weights=torch.ones_like(w)).loss
    torch.testing.assert_close(with_bonus, no_bonus - 0.1 * (H * mask).sum() / mask.sum(), rtol=0, atol=1e-14)
    legacy = policy_loss(logp, old, adv, mask, norms, **kw, entropy=H, entropy_coef=0.1).loss  # without entropy_weights: token_weights'
    torch.testing.assert_close(legacy, no_bonus - 0.1 * (H * mask * w).sum() / mask.sum(), rtol=0, atol=1e-14)
    assert (w == 0).any() and not torch.equal(with_bonus, legacy)
