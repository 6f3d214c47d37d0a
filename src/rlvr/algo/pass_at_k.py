"""pass@k, avg@k and maj@k of n sampled answers per problem.

pass@k: the chance that at least one of k answers drawn without replacement from a problem's n is
correct, estimated without bias from its c correct ones (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code", eq. 1):

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

(the product form: no large binomials). avg@k: the mean correctness of the n answers (pass@1's
estimate). maj@k: whether the answer given most often among the n (ties: the one given first) is
correct, for answers a verifier can compare (equal strings = the same answer).
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch


def pass_at_k(correct: torch.Tensor, k: int) -> torch.Tensor:
    """[P] pass@k of each problem from correct [P, n] (bool or 0/1), k <= n."""
    n = correct.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n samples, got k={k}, n={n}")
    c = correct.to(torch.float64).sum(-1)  # [P]
    i = torch.arange(1, n + 1, dtype=torch.float64)  # [n]
    factors = torch.where(i[None, :] > (n - c)[:, None], 1.0 - k / i[None, :], torch.ones(()))  # [P, n]
    return 1.0 - factors.prod(-1)  # fewer than k wrong answers: a factor is 0, pass@k is 1


def powers_of_two_up_to(n: int) -> list[int]:
    """1, 2, 4, ... <= n: the k of pass@k reported for n samples."""
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


def majority_correct(answers: Sequence[Sequence[str | None]], correct: torch.Tensor) -> torch.Tensor:
    """[P] maj@n: per problem, the correctness of the answer given most often (None: no answer, never a vote;
    no answer at all: 0). answers [P][n] as the verifier extracted them, correct [P, n]."""
    out = torch.zeros(len(answers), dtype=torch.float64)
    for p, given in enumerate(answers):
        votes = Counter(a for a in given if a is not None)
        if not votes:
            continue
        top = max(votes.values())
        winner = next(a for a in given if a is not None and votes[a] == top)  # ties: the first given
        out[p] = float(correct[p, list(given).index(winner)])
    return out


def mean_interval(values: torch.Tensor, z: float = 1.96, *, unit: bool = True) -> tuple[float, float, float]:
    """(mean, low, high): the mean of per-problem values with a normal-approximation interval (z standard
    errors of the mean over problems), clipped to [0, 1] for values that are shares (`unit`)."""
    v = values.to(torch.float64)
    mean = float(v.mean())
    half = z * float(v.std(unbiased=True)) / len(v) ** 0.5 if len(v) > 1 else 0.0
    return (mean, max(0.0, mean - half), min(1.0, mean + half)) if unit else (mean, mean - half, mean + half)
