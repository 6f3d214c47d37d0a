"""Phase 1 of a step, rollout and score: the `Collector` draws the step's prompts from the prompt stream,
has the rollout source generate episodes for them, scores them with the reward runner, and applies DAPO's
dynamic sampling (groups whose rewards are all equal are dropped and fresh prompts drawn).

With several processes every rank reads the same prompts from the stream; each generates and scores its
contiguous share of whole groups (prompt i's sampling is seeded by its stream position, so episodes do not
depend on the rank), then the scored episodes are gathered so every rank holds the whole batch
(rlvr.training.minibatches splits it again for the update).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from rlvr import algo
from rlvr.dist import full_weights_for_generation
from rlvr.rewards import RewardRunner
from rlvr.rollout.episodes import Episodes, RolloutSource

if TYPE_CHECKING:
    from rlvr.config import Config
    from rlvr.data import PromptStream
    from rlvr.training.state import TrainState


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
    loss_weight: float = 1.0  # 0: a placeholder share that only keeps a rank in step (minibatches.local_share)
    errors: dict = field(default_factory=dict)  # reward function name -> samples that failed in it
    generated_rewards: torch.Tensor | None = None  # [M, K] dynamic sampling: every group of every round, kept or not
    stale_dropped: int = 0  # episodes sampled more than rollout.max_staleness versions ago, dropped and made again (this rank's)


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
    # TRL's log_extra, beside what the rollout logged itself: rides with its rows into the completions table
    episodes.logged = {**episodes.logged, **runner.last_logged_columns}
    if episodes.extra_rewards:
        extra = [episodes.extra_rewards[k].to(rewards) for k in sorted(episodes.extra_rewards)]
        rewards = torch.cat([rewards, torch.stack(extra, dim=-1)], dim=-1)
    if episodes.valid is not None:
        rewards = rewards.masked_fill(~episodes.valid.to(rewards.device)[:, None], float("nan"))
    return rewards


class Collector:
    """Owns what phase 1 reads: the prompt stream, the rollout source, the reward runner, dynamic sampling
    and the gather across ranks. `collect(state)` gives one step's batch (every rank holds the whole batch)."""

    def __init__(self, stream: PromptStream, source: RolloutSource, rewards: RewardRunner, *, cfg: Config, dist, model, pad_token_id: int):
        """`model`: the policy whose weights generation uses (under FSDP2 every rank gathers them for each round)."""
        self.stream, self.source, self.rewards, self.cfg = stream, source, rewards, cfg
        self.dist, self.model, self.pad_token_id = dist, model, pad_token_id
        self.version, self.stale_dropped = 0, 0

    def collect(self, state: TrainState) -> Batch:
        """Episodes of this step's prompts, scored. `state`: the run so far, which reward functions see as TRL's trainer_state.
        Draws `rollout.prompts_per_step` rows; with dynamic sampling, groups whose rewards are all equal are dropped
        and fresh prompts drawn until the batch is full or `algo.max_resample_rounds` extra rounds are spent."""
        self.version, self.stale_dropped = state.step, 0  # the weights this batch trains have had `state.step` updates
        batch = self._rounds(state)
        batch.stale_dropped = self.stale_dropped
        return batch

    def _rounds(self, state: TrainState) -> Batch:
        rs = self.rewards.state
        rs.global_step, rs.max_steps, rs.epoch, rs.num_input_tokens_seen = state.step, self.cfg.steps, self.stream.epoch, state.num_tokens
        a, prompts = self.cfg.algo, self.cfg.rollout.prompts_per_step
        kept_rows: list[dict] = []
        kept_eps, kept_rewards, generated = [], [], []
        rounds = consumed = 0
        seconds = 0.0
        while True:
            need = prompts - len(kept_rows)
            position = self.stream.position
            rows = self.stream.take(need)
            consumed += need
            rounds += 1
            episodes, rewards, t = self.round(rows, position)
            names, weights = reward_columns(self.rewards, episodes)
            seconds += t
            if not a.dynamic_sampling:
                return Batch(rows, episodes, rewards, names, weights, rounds, consumed, seconds)
            generated.append(rewards)
            G = episodes.group_size
            signal = algo.groups_with_signal(rewards, weights, G, mode=a.reward_aggregation)
            keep_groups = signal.nonzero().squeeze(-1).tolist()
            if keep_groups:
                idx = torch.tensor([g * G + j for g in keep_groups for j in range(G)])
                kept_rows += [rows[g] for g in keep_groups]
                kept_eps.append(episodes.select(idx))
                kept_rewards.append(rewards[idx])
            if len(kept_rows) == prompts or rounds > a.max_resample_rounds:
                break
        every_round = torch.cat(generated)
        if not kept_rows:  # nothing had signal: train on the last round (zero advantages, zero update)
            return Batch(rows, episodes, rewards, names, weights, rounds, consumed, seconds, generated_rewards=every_round)
        return Batch(
            kept_rows,
            Episodes.concat(kept_eps, self.pad_token_id),
            torch.cat(kept_rewards),
            names,
            weights,
            rounds,
            consumed,
            seconds,
            generated_rewards=every_round,
        )

    def round(self, rows: list[dict], position: int) -> tuple[Episodes, torch.Tensor, float]:
        """One generation round over `rows` (drawn from stream position `position`): (episodes, rewards, seconds spent
        in rewards). Each rank runs its share of the rows and the results are gathered on every rank."""
        if not self.dist.enabled:
            return self.rollout_and_score(rows, position)
        part = self.dist.shard(len(rows))
        mine, seconds = None, 0.0
        # Every rank enters (FSDP2 gathers the weights with collectives), also one with no share of
        # this round: a dynamic-sampling round of fewer prompts than ranks leaves some without any.
        with full_weights_for_generation(self.dist, self.model):
            if part.stop > part.start:
                episodes, rewards, seconds = self.rollout_and_score(rows[part], position + part.start)
                mine = (episodes.to("cpu"), rewards.cpu(), seconds)
        parts = [p for p in self.dist.all_gather_object(mine, what="gather completions") if p is not None]
        # the time is this rank's own (time/reward is the reward share of this rank's step time)
        return Episodes.concat([p[0] for p in parts], self.pad_token_id), torch.cat([p[1] for p in parts]), seconds

    def rollout_and_score(self, rows: list[dict], position: int) -> tuple[Episodes, torch.Tensor, float]:
        """(episodes, rewards, seconds spent in rewards) of `rows`, drawn from stream position `position`. Prompt i's
        randomness is seeded by its stream position, so it gets the same episodes whatever batch, rank or resume it lands in."""
        seeds = self.seeds_of(position, len(rows))
        episodes = self.fresh(rows, seeds, self.source.rollout(rows, seeds))
        t = time.perf_counter()
        rewards = score(self.rewards, rows, episodes)
        return episodes, rewards, time.perf_counter() - t

    def seeds_of(self, position: int, n: int) -> list[int]:
        """The seeds of n rows drawn from stream position `position`: each row's own, whatever batch it lands in."""
        return [self.cfg.seed * 2**32 + position + i for i in range(n)]

    def fresh(self, rows: list[dict], seeds: list[int], episodes: Episodes) -> Episodes:
        """`episodes` with every group sampled more than rollout.max_staleness versions before the weights this step
        trains made again (a group whose rows a server made under older weights than allowed); counted in stale_dropped."""
        k, G = self.cfg.rollout.max_staleness, episodes.group_size
        while episodes.versions is not None:
            oldest = episodes.versions.view(-1, G).min(-1).values  # [groups]
            stale = (oldest < self.version - k).nonzero().squeeze(-1).tolist()
            if not stale:
                break
            self.stale_dropped += len(stale) * G
            redo = self.source.rollout([rows[g] for g in stale], [seeds[g] for g in stale])
            both = Episodes.concat([episodes, redo], self.pad_token_id)
            where = {g: len(episodes) + i * G for i, g in enumerate(stale)}  # group g's first row in `both`
            order = [where.get(g, g * G) + j for g in range(len(rows)) for j in range(G)]
            episodes = both.select(torch.tensor(order))
        return episodes
