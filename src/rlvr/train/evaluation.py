"""Held-out evaluation: greedy episodes scored by a task's verifier."""

from __future__ import annotations

from rlvr.rewards import RewardRunner
from rlvr.rollout.episodes import RolloutSource
from rlvr.train.collect import score


def evaluate(source: RolloutSource, rows: list[dict], reward: RewardRunner, *, batch_size: int = 128) -> float:
    """Mean of the (first) reward over the source's episodes of `rows` (one per row; greedy
    sampling is the caller's choice): accuracy for 0/1 verifiers."""
    if source.group_size != 1:
        raise ValueError(f"evaluate: the source must make one episode per row, not {source.group_size}")
    total = 0.0
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        episodes = source.rollout(chunk, list(range(len(chunk))))
        total += float(score(reward, chunk, episodes)[:, 0].nansum())
    return total / len(rows)
