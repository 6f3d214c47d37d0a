"""What the update trains on: the batch split into minibatches of whole groups, each its own optimizer step
(`optim.steps_per_generation`: TRL's steps_per_generation, verl's ppo_mini_batch_size), and this rank's share
of each. Advantages are the whole batch's, computed before the split; each minibatch then has its own loss
normalisers (it is a batch of its own) and keeps the generating policy's log-probs as its old log-probs
(Updater.prepare).

Every rank holds the whole batch (the Collector gathers it) and computes advantages, dynamic-sampling
decisions and batch metrics on it, exactly what one process would compute. Only the update is split: each
rank trains on its contiguous share of whole groups (`local_share`), with the whole minibatch's normalisers.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from rlvr.rollout.episodes import Episodes
from rlvr.training.collect import Batch


class Minibatch(NamedTuple):
    """This rank's share of one minibatch: what each epoch takes one optimizer step on."""

    episodes: Episodes  # n episodes, whole groups
    advantages: torch.Tensor  # [n]
    loss_weight: float = 1.0  # 0: a placeholder share that only keeps this rank in step with the others (`local_share`)


def minibatches(batch: Batch, advantages: torch.Tensor, k: int) -> list[tuple[Batch, torch.Tensor]]:
    """The batch as k contiguous minibatches of whole groups, in order, sizes as equal as they can be
    (fewer when the batch holds fewer than k groups, as dynamic sampling may leave it); k=1: the batch itself."""
    groups = len(batch.rows)
    if k <= 1 or groups <= 1:
        return [(batch, advantages)]
    G = batch.episodes.group_size
    pieces_n = min(k, groups)
    bounds = [j * groups // pieces_n for j in range(pieces_n + 1)]  # the group each minibatch starts at
    pieces = []
    for lo, hi in zip(bounds, bounds[1:]):
        idx = torch.arange(lo * G, hi * G)
        pieces.append(
            (
                dataclasses.replace(batch, rows=batch.rows[lo:hi], episodes=batch.episodes.select(idx), rewards=batch.rewards[idx]),
                advantages[idx],
            )
        )
    return pieces


def local_share(batch: Batch, advantages: torch.Tensor, dist) -> tuple[Batch, torch.Tensor]:
    """(this rank's part of the batch, its advantages). Whole groups, contiguous, in rank order.
    A rank left without a group (dynamic sampling kept fewer groups than ranks) gets group 0
    with `loss_weight` 0: it must still run forward/backward for the gradient reduction."""
    if not dist.enabled:
        return batch, advantages
    G = batch.episodes.group_size
    groups = dist.shard(len(batch.rows))
    weight = 1.0
    if groups.stop == groups.start:
        groups, weight = slice(0, 1), 0.0
    idx = torch.arange(groups.start * G, groups.stop * G)
    local = dataclasses.replace(
        batch, rows=batch.rows[groups], episodes=batch.episodes.select(idx), rewards=batch.rewards[idx], loss_weight=weight
    )
    return local, advantages[idx]


def this_ranks_minibatches(batch: Batch, advantages: torch.Tensor, k: int, dist) -> list[Minibatch]:
    """This rank's share of each of the batch's k minibatches, in order; an episode's extra training sequences
    (Episodes.extra_sequences) go with it, with its advantage."""
    shares = [local_share(piece, adv, dist) for piece, adv in minibatches(batch, advantages, k)]
    return [Minibatch(*share.episodes.with_extra_sequences(adv), share.loss_weight) for share, adv in shares]
