"""pass@k against a brute-force enumeration of every k-subset of the n samples, on random small cases; maj@k."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from rlvr.algo.pass_at_k import majority_correct, mean_interval, pass_at_k, powers_of_two_up_to


def _brute(correct: list[bool], k: int) -> float:
    """The share of k-subsets of the samples holding a correct one."""
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_enumerating_every_subset():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 10)
        rows = [[rng.random() < rng.random() for _ in range(n)] for _ in range(rng.randint(1, 4))]
        for k in range(1, n + 1):
            got = pass_at_k(torch.tensor(rows), k)
            want = torch.tensor([_brute(r, k) for r in rows], dtype=torch.float64)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_pass_at_k_edges_and_order():
    correct = torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert pass_at_k(correct, 1).tolist() == [0.0, 1.0, 0.25]
    assert pass_at_k(correct, 4).tolist() == [0.0, 1.0, 1.0]
    values = [float(pass_at_k(torch.tensor([[1, 0, 0, 1, 0, 0, 0, 0]]), k)) for k in powers_of_two_up_to(8)]
    assert values == sorted(values) and powers_of_two_up_to(8) == [1, 2, 4, 8] and powers_of_two_up_to(6) == [1, 2, 4]
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(correct, 5)


def test_majority_vote_takes_the_most_given_answer_first_on_ties():
    answers = [["4", "5", "4", None], ["7", "8", None, None], [None, None, None, None], ["1", "2", "2", "1"]]
    correct = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 0]])
    assert majority_correct(answers, correct).tolist() == [1.0, 0.0, 0.0, 0.0]  # ties: "7" and "1" were given first


def test_mean_interval_holds_the_mean_and_stays_in_range():
    mean, low, high = mean_interval(torch.tensor([1.0, 1.0, 0.0, 1.0]))
    assert mean == 0.75 and 0.0 <= low < 0.75 < high == 1.0
    assert mean_interval(torch.tensor([0.5])) == (0.5, 0.5, 0.5)
    mean, low, high = mean_interval(torch.tensor([-2.0, 0.0, 2.0]), unit=False)  # a reward's mean: not clipped
    assert mean == 0.0 and low == -high and low < -1
