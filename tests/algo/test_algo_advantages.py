"""Group advantages and multi-reward combination: the seeds' worked example by hand, then every
scale / ddof / aggregation mode against a reference written here as plain Python loops (to 1e-10
in float64), and DAPO's dynamic-sampling signal."""

import math

import pytest
import torch

from rlvr.algo import combine_rewards, group_advantages, groups_with_signal

D = torch.float64
TOL = dict(rtol=0, atol=1e-10)
SEEDS = [0, 1, 2]


def test_seeds_worked_example():
    r = torch.tensor([0.8, 0.3, 0.6, 0.3], dtype=D)
    adv = group_advantages(r, 4)
    assert [round(a, 2) for a in adv.tolist()] == [1.41, -0.94, 0.47, -0.94]
    std = math.sqrt((0.3**2 + 0.2**2 + 0.1**2 + 0.2**2) / 4)  # population std, ~0.2121
    torch.testing.assert_close(adv, torch.tensor([0.3, -0.2, 0.1, -0.2], dtype=D) / (std + 1e-8), **TOL)
    assert group_advantages(torch.full((4,), 0.7, dtype=D), 4).abs().max().item() == 0.0
    assert group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), 3).tolist() == [0.0] * 6  # float32 too
    sample = group_advantages(r, 4, ddof=1)  # TRL's torch.std
    assert [round(a, 2) for a in sample.tolist()] == [1.22, -0.82, 0.41, -0.82]  # as docs/algorithms.md says
    torch.testing.assert_close(sample, (r - r.mean()) / (r.std() + 1e-8), **TOL)


def ref_advantages(rewards, G, scale, ddof, eps=1e-8):
    r = rewards.tolist()
    out = []
    allv = [v for v in r if not math.isnan(v)]
    bm = sum(allv) / len(allv)
    bstd = math.sqrt(sum((v - bm) ** 2 for v in allv) / max(len(allv) - ddof, 1))
    for g0 in range(0, len(r), G):
        grp = [v for v in r[g0 : g0 + G] if not math.isnan(v)]
        m = sum(grp) / len(grp) if grp else 0.0
        sd = math.sqrt(sum((v - m) ** 2 for v in grp) / max(len(grp) - ddof, 1)) if grp else 0.0
        div = {"group": sd + eps, "batch": bstd + eps, "none": 1.0}[scale]
        out += [0.0 if math.isnan(v) else (v - m) / div for v in r[g0 : g0 + G]]
    return torch.tensor(out, dtype=D)


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
    scored = [i for i, row in enumerate(rows) if not all(math.isnan(v) for v in row)]  # a completion no function scored: 0
    if scale == "none":
        return torch.tensor([s[i] if i in scored else 0.0 for i in range(len(rows))], dtype=D)
    m = sum(s[i] for i in scored) / len(scored)
    sd = math.sqrt(sum((s[i] - m) ** 2 for i in scored) / max(len(scored) - ddof, 1))
    return torch.tensor([(s[i] - m) / (sd + eps) if i in scored else 0.0 for i in range(len(rows))], dtype=D)


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
    rewards = torch.tensor(
        [
            [1, 0],
            [1, 0],  # group 0: identical -> no signal
            [1, 0],
            [0, 2],  # group 1: weighted sums tie, components differ
            [1, 0],
            [0, 0],  # group 2: differ
            [1, float("nan")],
            [float("nan"), float("nan")],  # group 3: one valid completion only
        ],
        dtype=D,
    )
    w = torch.tensor([1.0, 0.5])
    assert groups_with_signal(rewards, w, G, mode="sum_then_normalize").tolist() == [False, False, True, False]
    assert groups_with_signal(rewards, w, G, mode="normalize_then_sum").tolist() == [False, True, True, False]
    assert group_advantages(torch.tensor([0.1, 0.1, 0.1], dtype=D), 3).abs().max().item() == 0.0  # not 1e-9
    for mode in ("sum_then_normalize", "normalize_then_sum"):  # consistent with the advantages
        adv = combine_rewards(rewards, w, G, mode=mode).view(-1, G)
        sig = groups_with_signal(rewards, w, G, mode=mode)
        assert ((adv.abs().amax(-1) > 1e-6) == sig).all(), mode
