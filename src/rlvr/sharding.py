"""How one step's batch is split across ranks and put back together (see rlvr.dist).

Every rank reads the same prompts from the stream; each generates and scores its contiguous
share of whole groups (prompt i's sampling is seeded by its stream position, so completions do
not depend on the rank), then the scored rollouts are gathered so every rank holds the whole
batch. Advantages, dynamic-sampling decisions and batch metrics are then computed on the whole
batch on every rank: exactly what one process would compute. Only the update is split: each
rank trains on its share (`local_share`), with the whole batch's normalisers.
"""

from __future__ import annotations

import dataclasses

import torch

from rlvr.rollout import Rollout


def _cpu(r: Rollout) -> Rollout:
    values = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
    return Rollout(**{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in values.items()})


def generate_sharded(trainer, rows: list[dict], position: int) -> tuple[Rollout, torch.Tensor]:
    """(rollout, rewards) of all `rows`, each rank generating and scoring its share."""
    d = trainer.dist
    if not d.enabled:
        return trainer._generate_and_score(rows, position)
    part = d.shard(len(rows))
    mine = None
    # Every rank enters (FSDP2 gathers the weights with collectives), also one with no share of
    # this round: a dynamic-sampling round of fewer prompts than ranks leaves some without any.
    with d.full_weights_for_generation(trainer.model):
        if part.stop > part.start:
            rollout, rewards = trainer._generate_and_score(rows[part], position + part.start)
            mine = (_cpu(rollout), rewards.cpu())
    parts = [p for p in d.all_gather_object(mine, what="gather completions") if p is not None]
    return Rollout.concat([p[0] for p in parts], trainer.tokenizer.pad_token_id), torch.cat([p[1] for p in parts])


def local_share(batch, advantages: torch.Tensor, dist, group_size: int):
    """(this rank's part of the batch, its advantages). Whole groups, contiguous, in rank order.
    A rank left without a group (dynamic sampling kept fewer groups than ranks) gets group 0
    with `loss_weight` 0: it must still run forward/backward for the gradient reduction."""
    if not dist.enabled:
        return batch, advantages
    groups = dist.shard(len(batch.rows))
    weight = 1.0
    if groups.stop == groups.start:
        groups, weight = slice(0, 1), 0.0
    idx = torch.arange(groups.start * group_size, groups.stop * group_size)
    local = dataclasses.replace(
        batch, rows=batch.rows[groups], rollout=batch.rollout.select(idx), rewards=batch.rewards[idx], loss_weight=weight
    )
    return local, advantages[idx]
