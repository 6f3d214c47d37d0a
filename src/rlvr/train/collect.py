"""One step's batch: episodes from the rollout source, scored by the reward functions, with
DAPO's dynamic sampling (groups whose rewards are all equal are dropped and fresh prompts drawn)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from rlvr import algo
from rlvr.rewards import RewardRunner
from rlvr.rollout.episodes import Episodes, RolloutSource


@dataclass
class Batch:
    """One step's scored episodes. N = groups x G rows, group-major."""

    rows: list[dict]  # [groups] dataset rows, one per prompt
    episodes: Episodes  # N episodes
    rewards: torch.Tensor  # [N, K] one column per reward source, NaN = not applicable
    reward_names: list[str]  # [K] the reward functions, then the rewards the rollout gave (e.g. an environment's)
    reward_weights: torch.Tensor  # [K]
    rounds: int = 1  # generation rounds it took (dynamic sampling)
    prompts_consumed: int = 0  # prompts drawn from the stream for it
    reward_seconds: float = 0.0  # time spent in reward functions (all rounds, this rank's share)
    loss_weight: float = 1.0  # 0: a placeholder share that only keeps a rank in step (rank_split.local_share)
    errors: dict = field(default_factory=dict)  # reward function name -> samples that failed in it
    generated_rewards: torch.Tensor | None = None  # [M, K] dynamic sampling: every group of every round, kept or not


def reward_columns(runner: RewardRunner, episodes: Episodes) -> tuple[list[str], torch.Tensor]:
    """(names [K], weights [K]) of the reward columns `score` gives: the reward functions with their
    weights, then each reward the rollout gave itself with weight 1 (an environment owns its scale, as in TRL)."""
    extra = sorted(episodes.extra_rewards)
    return runner.names + extra, torch.cat([runner.weights, torch.ones(len(extra), dtype=runner.weights.dtype)])


def score(runner: RewardRunner, rows: list[dict], episodes: Episodes) -> torch.Tensor:
    """[N, K] rewards of the episodes (columns as `reward_columns` names them); row i's dataset columns
    reach the functions as keyword arguments. Episodes that failed to start get NaN everywhere. The
    columns reward functions logged (log_extra) are set on `episodes.logged`."""
    G = episodes.group_size
    columns = {k: [r.get(k) for r in rows for _ in range(G)] for k in rows[0] if k != "prompt"}
    columns.update(episodes.columns)  # the rollout's own per-episode values (e.g. a rollout function's extra fields)
    ids = [c[m.bool()].tolist() for c, m in zip(episodes.completion_ids, episodes.attention_mask)]
    rewards = runner([r["prompt"] for r in rows for _ in range(G)], episodes.completions, columns, completion_ids=ids)
    episodes.logged = dict(runner.last_logged_columns)  # TRL's log_extra: rides with its rows into the completions table
    if episodes.extra_rewards:
        extra = [episodes.extra_rewards[k].to(rewards) for k in sorted(episodes.extra_rewards)]
        rewards = torch.cat([rewards, torch.stack(extra, dim=-1)], dim=-1)
    if episodes.valid is not None:
        rewards = rewards.masked_fill(~episodes.valid.to(rewards.device)[:, None], float("nan"))
    return rewards


def rollout_and_score(source: RolloutSource, runner: RewardRunner, seed: int) -> Callable:
    """The work of one generation round, for `rows` starting at stream position `position`:
    (episodes, rewards, seconds spent in rewards). Prompt i's randomness is seeded by its stream
    position, so it gets the same episodes whatever batch, rank or resume it lands in."""

    def work(rows: list[dict], position: int) -> tuple[Episodes, torch.Tensor, float]:
        episodes = source.rollout(rows, [seed * 2**32 + position + i for i in range(len(rows))])
        t = time.perf_counter()
        rewards = score(runner, rows, episodes)
        return episodes, rewards, time.perf_counter() - t

    return work


def collect(stream, round_fn: Callable, runner: RewardRunner, *, prompts: int, pad_token_id: int, dynamic_sampling: bool = False,
            max_resample_rounds: int = 0, reward_aggregation: str = "sum_then_normalize") -> Batch:
    """Draw `prompts` rows from the stream and run `round_fn(rows, position) -> (episodes, rewards,
    seconds)` on them. With dynamic sampling, groups whose rewards are all equal are dropped and
    fresh prompts drawn until the batch is full or max_resample_rounds extra rounds are spent."""
    kept_rows, kept_eps, kept_rewards, generated = [], [], [], []
    rounds = consumed = 0
    seconds = 0.0
    while True:
        need = prompts - len(kept_rows)
        position = stream.position
        rows = stream.take(need)
        consumed += need
        rounds += 1
        episodes, rewards, t = round_fn(rows, position)
        names, weights = reward_columns(runner, episodes)
        seconds += t
        if not dynamic_sampling:
            return Batch(rows, episodes, rewards, names, weights, rounds, consumed, seconds)
        generated.append(rewards)
        G = episodes.group_size
        signal = algo.groups_with_signal(rewards, weights, G, mode=reward_aggregation)
        keep_groups = signal.nonzero().squeeze(-1).tolist()
        if keep_groups:
            idx = torch.tensor([g * G + j for g in keep_groups for j in range(G)])
            kept_rows += [rows[g] for g in keep_groups]
            kept_eps.append(episodes.select(idx))
            kept_rewards.append(rewards[idx])
        if len(kept_rows) == prompts or rounds > max_resample_rounds:
            break
    generated = torch.cat(generated)
    if not kept_rows:  # nothing had signal: train on the last round (zero advantages, zero update)
        return Batch(rows, episodes, rewards, names, weights, rounds, consumed, seconds, generated_rewards=generated)
    return Batch(kept_rows, Episodes.concat(kept_eps, pad_token_id), torch.cat(kept_rewards), names, weights, rounds, consumed, seconds,
                 generated_rewards=generated)
