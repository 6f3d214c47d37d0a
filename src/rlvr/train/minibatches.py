"""Several optimizer steps per generated batch (`optim.steps_per_generation`): the batch split into
minibatches of whole groups, each its own optimizer step (TRL's steps_per_generation, verl's
ppo_mini_batch_size). Advantages are the whole batch's, computed before the split; each minibatch
then has its own loss normalisers (it is a batch of its own), is shared across ranks as a whole
batch is, and keeps the generating policy's log-probs as its old log-probs (Updater.update).
"""

from __future__ import annotations

import dataclasses

import torch

from rlvr.train.collect import Batch


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
        pieces.append((dataclasses.replace(batch, rows=batch.rows[lo:hi], episodes=batch.episodes.select(idx),
                                           rewards=batch.rewards[idx]), advantages[idx]))
    return pieces
