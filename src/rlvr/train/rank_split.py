"""How one step's batch is split across ranks and put back together (see rlvr.dist).

Every rank reads the same prompts from the stream; each generates and scores its contiguous
share of whole groups (prompt i's sampling is seeded by its stream position, so episodes do
not depend on the rank), then the scored episodes are gathered so every rank holds the whole
batch. Advantages, dynamic-sampling decisions and batch metrics are then computed on the whole
batch on every rank: exactly what one process would compute. Only the update is split: each
rank trains on its share (`local_share`), with the whole batch's normalisers.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from rlvr.dist import full_weights_for_generation
from rlvr.rollout.episodes import Episodes


def across_ranks(dist, model, work: Callable, pad_token_id: int) -> Callable:
    """`work(rows, position) -> (episodes, rewards, seconds)` run by each rank on its share of the
    rows, the results gathered on every rank (the identity with one process)."""
    if not dist.enabled:
        return work

    def sharded(rows: list[dict], position: int):
        part = dist.shard(len(rows))
        mine, seconds = None, 0.0
        # Every rank enters (FSDP2 gathers the weights with collectives), also one with no share of
        # this round: a dynamic-sampling round of fewer prompts than ranks leaves some without any.
        with full_weights_for_generation(dist, model):
            if part.stop > part.start:
                episodes, rewards, seconds = work(rows[part], position + part.start)
                mine = (episodes.to("cpu"), rewards.cpu(), seconds)
        parts = [p for p in dist.all_gather_object(mine, what="gather completions") if p is not None]
        # the time is this rank's own (time/reward is the reward share of this rank's step time)
        return Episodes.concat([p[0] for p in parts], pad_token_id), torch.cat([p[1] for p in parts]), seconds

    return sharded


def local_share(batch, advantages: torch.Tensor, dist):
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
    local = dataclasses.replace(batch, rows=batch.rows[groups], episodes=batch.episodes.select(idx), rewards=batch.rewards[idx],
                                loss_weight=weight)
    return local, advantages[idx]
