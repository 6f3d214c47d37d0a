"""Held-out evaluation: greedy episodes of a held-out set, scored by one reward function.

A `HeldOut` is rows plus the reward that scores them. A built-in task brings both (`task_held_out`:
its held-out split and its verifier, e.g. arithmetic's exact answer); a dataset brings the rows
and names the reward (`dataset_held_out`, e.g. a JSONL file scored by `math` or `my.py:fn`).
`rlvr eval` and the trainer evaluate the same way; a new task (code, ...) plugs in by giving its
`rlvr.data.Task` an `eval_rows` and a `reward`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.config import Config
from rlvr.data import Task, load_rows
from rlvr.data.checks import check_reward_columns
from rlvr.rewards import RewardFn, RewardRunner, load_reward_fn
from rlvr.rollout.episodes import RolloutSource
from rlvr.train.collect import score


@dataclass
class HeldOut:
    """A held-out set: its rows and the reward whose mean over them is the held-out number."""

    name: str  # what was evaluated: the task's name, or the dataset as given
    rows: list[dict]
    reward: str  # reward spec (built-in name, module:function, file.py:function)
    label: str  # what the number is: `accuracy` (a task's 0/1 verifier) or `mean <reward>`

    def runner(self) -> RewardRunner:
        """The reward as a one-function runner (loading it here names a missing file or function)."""
        runner = RewardRunner([RewardFn("eval", load_reward_fn(self.reward), 1.0)])
        check_reward_columns(runner.fns, self.rows[0])
        return runner


def task_held_out(task: Task, reward: str | None = None) -> HeldOut:
    """A built-in task's held-out split, scored by its own verifier (or `reward`)."""
    return HeldOut(task.name, task.eval_rows(), reward or task.reward, "accuracy" if reward is None else _mean_of(reward))


def dataset_held_out(source: str, *, reward: str, prompt_column: str = "prompt", split: str = "test",
                     subset: str | None = None, size: int = 0, what: str = "--data") -> HeldOut:
    """Rows of a dataset (as `data.path` reads them), the first `size` of them (0: all); `what` names the setting in errors."""
    rows = load_rows(source, prompt_column=prompt_column, split=split, subset=subset, what=what)
    return HeldOut(source, rows[:size] if size else rows, reward, _mean_of(reward))


def _mean_of(reward: str) -> str:
    """`mean correct` for `my_rewards.py:correct`, `mean math` for `math`."""
    return f"mean {reward.rsplit(':', 1)[-1]}"


def held_out_for(cfg: Config, task: Task | None) -> HeldOut | None:
    """The held-out set a training config describes: `eval.data`, else the built-in task's split, else none."""
    e = cfg.eval
    if e.data is not None:
        return dataset_held_out(e.data, reward=e.reward or cfg.rewards[0].fn, prompt_column=e.prompt_column or cfg.data.prompt_column,
                                split=e.split, subset=e.subset, size=e.size, what="eval.data")
    return task_held_out(task, e.reward) if task is not None else None


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
