"""Group advantages against hand-computed values (the seeds' worked example first)."""

import math

import pytest
import torch

from rlvr.algo import combine_rewards, group_advantages


def test_seeds_worked_example():
    adv = group_advantages(torch.tensor([0.8, 0.3, 0.6, 0.3], dtype=torch.float64), 4)
    # mean 0.5, population std sqrt(0.045) = 0.2121...
    std = math.sqrt((0.09 + 0.04 + 0.01 + 0.04) / 4)
    expected = [0.3 / std, -0.2 / std, 0.1 / std, -0.2 / std]
    assert adv.tolist() == pytest.approx(expected, abs=1e-7)
    assert [round(x, 2) for x in adv.tolist()] == [1.41, -0.94, 0.47, -0.94]


def test_equal_rewards_give_zero():
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), 3)
    assert adv.tolist() == [0.0] * 6


def test_groups_are_independent():
    adv = group_advantages(torch.tensor([1.0, 0.0, 5.0, 7.0], dtype=torch.float64), 2)
    assert adv.tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-7)


def test_scale_batch_uses_the_std_of_all_rewards():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    std = math.sqrt((0.75**2 + 3 * 0.25**2) / 4)  # population std of the whole batch
    adv = group_advantages(r, 2, scale="batch")
    assert adv.tolist() == pytest.approx([0.5 / std, -0.5 / std, 0.0, 0.0], abs=1e-7)


def test_scale_none_only_centres():
    adv = group_advantages(torch.tensor([0.8, 0.3, 0.6, 0.3], dtype=torch.float64), 4, scale="none")
    assert adv.tolist() == pytest.approx([0.3, -0.2, 0.1, -0.2], abs=1e-12)


def test_ddof_one_matches_torch_std():
    r = torch.tensor([0.8, 0.3, 0.6, 0.3], dtype=torch.float64)
    adv = group_advantages(r, 4, ddof=1, eps=0.0)
    assert adv.tolist() == pytest.approx(((r - r.mean()) / r.std()).tolist(), abs=1e-12)


def test_none_rewards_are_left_out_of_the_group():
    r = torch.tensor([1.0, float("nan"), 0.0, 0.0], dtype=torch.float64)
    adv = group_advantages(r, 4)
    std = math.sqrt((4 / 9 + 2 * 1 / 9) / 3)
    assert adv[1].item() == 0.0
    assert adv[[0, 2, 3]].tolist() == pytest.approx([2 / 3 / std, -1 / 3 / std, -1 / 3 / std], abs=1e-7)


def test_unknown_scale_is_refused():
    with pytest.raises(ValueError, match="scale must be one of"):
        group_advantages(torch.zeros(4), 2, scale="grouped")


def test_weighted_sum_then_normalize():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    adv = combine_rewards(rewards, torch.tensor([1.0, 0.5]), 4)
    total = torch.tensor([1.0, 0.5, 1.5, 0.0], dtype=torch.float64)
    expected = (total - total.mean()) / (total.std(correction=0) + 1e-8)
    assert adv.tolist() == pytest.approx(expected.tolist(), abs=1e-12)
