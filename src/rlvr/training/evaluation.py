"""Held-out evaluation: greedy episodes of a held-out set, scored by one reward.

A `HeldOut` is rows plus the reward that scores them. A built-in task brings both (`task_held_out`:
its held-out split and its verifier, e.g. arithmetic's exact answer); a dataset brings the rows
and names the reward (`dataset_held_out`, e.g. a JSONL file scored by `math` or `my.py:fn`), or,
in a run with an environment and no reward function, leaves the scoring to the environment's own
`get_reward()`. `rlvr eval` and the trainer evaluate the same way; a new task (code, ...) plugs in
by giving its `rlvr.tasks.Task` an `eval_rows` and a `reward`.

A failed evaluation is never a score: when the reward fails (raises, times out, returns garbage)
on every row, `evaluate` raises EvaluationError naming the reward and its first error; when it
fails on some rows, the outcome says how many (they count as 0 in the mean).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from rlvr.algo.pass_at_k import majority_correct, mean_interval, pass_at_k, powers_of_two_up_to
from rlvr.config import Config, ConfigError, RewardConfig
from rlvr.data import load_rows
from rlvr.data.checks import check_reward_columns
from rlvr.rewards import RewardFn, RewardRunner, load_reward_fn
from rlvr.rollout.episodes import RolloutSource
from rlvr.tasks import Task
from rlvr.training.collect import reward_columns, score
from rlvr.training.step_metrics import reward_metrics


class EvaluationError(RuntimeError):
    """A held-out evaluation that produced no score: its reward failed on every row."""


ALL_REWARDS = "all"  # eval.reward: the training's reward functions, weighted and summed (TRL's eval_reward)


@dataclass
class HeldOut:
    """A held-out set: its rows and the reward whose mean over them is the held-out number."""

    name: str  # what was evaluated: the task's name, or the dataset as given
    rows: list[dict]
    reward: str | None  # reward spec (built-in name, module:function, file.py:function); None: the environment's get_reward()
    label: str  # what the number is: `accuracy` (a task's 0/1 verifier) or `mean <reward>`
    environment: str | None = None  # with reward None: the class name of the environment whose get_reward() scores
    weighted: list[RewardConfig] | None = None  # eval.reward=all: the training's rewards (reward is then ALL_REWARDS)

    @property
    def column(self) -> str | None:
        """The reward column the score is the mean of: None for the runner's function(s), else the environment's."""
        return self.environment if self.reward is None else None

    def runner(self, provided: frozenset[str] | None = frozenset()) -> RewardRunner:
        """The reward as a one-function runner (loading it here names a missing file or function), the training's
        weighted functions (eval.reward=all), or no function when the environment scores. `provided`: columns the
        rollout adds (check_reward_columns)."""
        if self.reward is None:
            return RewardRunner([])
        if self.weighted is not None:
            runner = RewardRunner.from_config(self.weighted)
        else:
            fn = load_reward_fn(self.reward)
            runner = RewardRunner([RewardFn(getattr(fn, "__name__", self.reward), fn, 1.0)])
        check_reward_columns(runner.fns, self.rows[0], provided)
        return runner

    def evaluate(self, source: RolloutSource, runner: RewardRunner) -> EvalOutcome:
        """`evaluate` of these rows with the runner `runner()` made."""
        return evaluate(source, self.rows, runner, column=self.column, weighted=self.weighted is not None)

    def summary(self, before: float | None, after: float) -> dict:
        """summary.json's held-out numbers: before (kept in the checkpoints, so a resumed run has it) and after."""
        numbers = {"eval_before": before} if before is not None else {}
        return {**numbers, "eval_after": after, "eval_set": self.name, "eval_label": self.label, "eval_rows": len(self.rows)}


def task_held_out(task: Task, reward: str | None = None) -> HeldOut:
    """A built-in task's held-out split, scored by its own verifier (or `reward`)."""
    return HeldOut(task.name, task.eval_rows(), reward or task.reward, "accuracy" if reward is None else _mean_of(reward))


def dataset_held_out(
    source: str,
    *,
    reward: str | None,
    prompt_column: str = "prompt",
    split: str = "test",
    subset: str | None = None,
    size: int = 0,
    environment: str | None = None,
    what: str = "--data",
    scorer: str | None = None,
) -> HeldOut:
    """Rows of a dataset (as `data.path` reads them), the first `size` of them (0: all); `what` names the setting
    in errors. `reward` None: scored by the get_reward() of `environment` (a tools.environment spec), or by the
    reward column `scorer` the rollout itself fills (an agent's)."""
    if reward is None and scorer is None:
        scorer = environment_reward_name(environment)
    rows = load_rows(source, prompt_column=prompt_column, split=split, subset=subset, what=what)
    rows = rows[:size] if size else rows
    if (scored_by := reward or scorer) is None:  # reward == ""
        raise ConfigError(f"{what}: the reward name is empty")
    return HeldOut(source, rows, reward, _mean_of(scored_by), environment=scorer)


def environment_reward_name(spec: str | None) -> str:
    """The name of the reward column an environment's get_reward() fills (its class name); an error
    when there is no environment, or it has no get_reward()."""
    from rlvr.tasks import ENVIRONMENTS
    from rlvr.tools import EnvironmentFactory

    if spec is None:
        raise ConfigError("nothing scores the held-out rows: name a reward (eval.reward, or rlvr eval --reward)")
    env = EnvironmentFactory(ENVIRONMENTS.get(spec, spec))
    if not env.has_reward:
        raise ConfigError(
            f"nothing scores the held-out rows: no reward is named and the environment {env.name} has no "
            "get_reward(); set eval.reward (rlvr eval --reward), or give the environment a get_reward() method"
        )
    return env.name


def _mean_of(reward: str) -> str:
    """`mean correct` for `my_rewards.py:correct`, `mean math` for `math`."""
    return f"mean {reward.rsplit(':', 1)[-1]}"


def held_out_for(cfg: Config, task: Task | None) -> HeldOut | None:
    """The held-out set a training config describes: `eval.data`, else the built-in task's split, else none.
    `eval.data` is scored by eval.reward, else rewards.0.fn, else (rewards: []) the environment's get_reward();
    eval.reward=all: by the training's rewards, weighted and summed."""
    e = cfg.eval
    held = None
    if e.data is not None:
        reward = e.reward or (cfg.rewards[0].fn if cfg.rewards else None)
        held = dataset_held_out(
            e.data,
            reward=reward,
            prompt_column=e.prompt_column or cfg.data.prompt_column,
            split=e.split,
            subset=e.subset,
            size=e.size,
            environment=cfg.tools.environment,
            what="eval.data",
        )
    elif task is not None:
        held = task_held_out(task, e.reward)
    return held if held is None else weighing_all(held, cfg)


def weighing_all(held: HeldOut, cfg: Config) -> HeldOut:
    """The held-out set scored by the training's reward functions, weighted and summed, where its reward is `all`."""
    if held.reward == ALL_REWARDS:
        if not cfg.rewards:
            raise ConfigError("eval.reward=all sums the training's reward functions (rewards.*), and rewards is empty: name a reward")
        held.weighted, held.label = list(cfg.rewards), "mean weighted reward"
    return held


@dataclass
class EvalOutcome:
    """A held-out score and what went wrong on the way; with several samples per row, pass@k and friends."""

    score: float  # mean of the reward over the rows (a failed row counts 0); several samples: over every sample (avg@k)
    rows: int
    failed: int  # episodes the reward failed on (raised, timed out, returned garbage; an environment: reset/get_reward raised)
    reward: str  # the reward column: the function's name, or the environment's
    first_error: str | None  # the first failure, `ValueError: message (at file:line in fn)`
    samples: int = 1  # episodes per row
    pass_at: dict[int, Interval] = field(default_factory=dict)  # k -> pass@k (a 0/1 reward and samples > 1)
    maj: Interval | None = None  # maj@samples, when the reward can compare answers (its `extract_answer`)
    avg: Interval | None = None  # avg@samples with its interval (samples > 1)
    by_function: dict[str, float] = field(default_factory=dict)  # weighted: reward_std, rewards/<fn>/mean and /std (TRL's)

    def failure_note(self) -> str:
        """`the reward 'x' failed on 2 of 5 held-out rows (counted as 0): ValueError: ...`."""
        first = f"; its first error: {self.first_error}" if self.first_error else ""
        what = "rows" if self.samples == 1 else "episodes"
        if self.by_function:  # weighted: a failed call is left out of the sum, as a None is
            return f"reward calls failed {self.failed} times on {self.rows * self.samples} held-out {what} (left out of the sums){first}"
        return f"the reward {self.reward!r} failed on {self.failed} of {self.rows * self.samples} held-out {what} (counted as 0){first}"

    def metrics(self) -> dict[str, float]:
        """eval/pass@k (each k), eval/avg@n, eval/maj@n: the numbers of a sampled evaluation ({} for one sample per row);
        weighted: eval/reward_std and eval/rewards/<fn>/mean and /std."""
        out = {f"eval/{k}": v for k, v in self.by_function.items()}
        out.update({f"eval/pass@{k}": v.mean for k, v in self.pass_at.items()})
        if self.avg is not None:
            out[f"eval/avg@{self.samples}"] = self.avg.mean
        if self.maj is not None:
            out[f"eval/maj@{self.samples}"] = self.maj.mean
        return out


class Interval(NamedTuple):
    """A mean over problems with its 95 % interval (algo.pass_at_k.mean_interval)."""

    mean: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def evaluate(
    source: RolloutSource,
    rows: list[dict],
    reward: RewardRunner,
    *,
    column: str | None = None,
    weighted: bool = False,
    batch_size: int = 128,
) -> EvalOutcome:
    """Mean of one reward over the source's episodes of `rows` (greedy with one per row, or source.group_size samples
    per row: then also pass@k for a 0/1 reward, and maj@n when the reward can compare answers: a reward function with an
    `extract_answer(completion) -> str | None` attribute, equal strings being the same answer): accuracy for 0/1
    verifiers. `column`: the reward column to average (an environment's); None: the runner's first function. Row i
    is seeded i. Raises EvaluationError when the reward failed on every episode. `weighted`: the mean of the runner's
    weighted sum instead (`evaluate_weighted`)."""
    if weighted:
        return evaluate_weighted(source, rows, reward, batch_size=batch_size)
    n, values, answers = source.group_size, [], []
    failed, name = 0, column
    extract = getattr(reward.fns[0].fn, "extract_answer", None) if reward.fns and column is None else None
    for episodes, rewards in _scored_chunks(source, rows, reward, batch_size):
        names, _ = reward_columns(reward, episodes)
        name = column or names[0]
        if name not in names:
            raise ValueError(f"evaluate: no reward column {name!r} among {names}")
        values.append(rewards[:, names.index(name)].view(-1, n))  # [rows, n]
        answers += [extract(c) for c in episodes.completions] if extract else []
        failed += _failures(reward, name, episodes)
    assert name is not None, "rows is not empty: the first batch named the column"
    first = reward.first_error.get(name) or getattr(source, "first_env_error", None)
    per = torch.cat(values).double().nan_to_num(0.0)  # [P, n] a failed episode counts 0
    outcome = EvalOutcome(float(per.mean()), len(rows), failed, str(name), first, n)
    if n > 1:
        _sampled_numbers(outcome, per, answers)
    if failed and failed >= len(rows) * n:
        raise EvaluationError(
            f"no held-out score: the reward {outcome.reward!r} failed on every one of the {len(rows)} rows; "
            f"its first error: {first or 'unknown'}"
        )
    return outcome


def evaluate_weighted(source: RolloutSource, rows: list[dict], reward: RewardRunner, *, batch_size: int = 128) -> EvalOutcome:
    """TRL's eval_reward: the mean over the episodes of the reward functions' weighted sum (a None, or a failed call,
    left out of its episode's sum; an episode no function scored left out of the mean), with the sum's std and each
    function's mean and std over the episodes it scored (`by_function`, TRL's names); pass@k and avg@n as `evaluate`
    gives them, where every episode was scored. EvaluationError when no episode was."""
    n, scored, failed, first = source.group_size, [], 0, None
    for episodes, rewards in _scored_chunks(source, rows, reward, batch_size):
        names, weights = reward_columns(reward, episodes)
        scored.append(rewards.double())  # [N, K]
        failed += sum(reward.last_errors.values())
        first = first or next((e for e in reward.first_error.values() if e), None)
    by_fn = torch.cat(scored)  # [rows x n, K]
    total = (by_fn * weights.to(by_fn)).nansum(-1).masked_fill(by_fn.isnan().all(-1), float("nan"))  # [rows x n]
    what = f"weighted sum of {', '.join(names)}"
    if bool(total.isnan().all()):
        raise EvaluationError(f"no held-out score: no reward function scored any of the {len(rows)} rows ({what}); first error: {first}")
    stats = reward_metrics(by_fn, weights.to(by_fn), names, n)  # the training step's, TRL's
    spread = {k: v for k, v in stats.items() if k == "reward_std" or k.startswith("rewards/")}
    outcome = EvalOutcome(stats["reward"], len(rows), failed, what, first, n, by_function=spread)
    if n > 1 and not bool(total.isnan().any()):
        _sampled_numbers(outcome, total.view(-1, n), [])
    return outcome


def _scored_chunks(source: RolloutSource, rows: list[dict], reward: RewardRunner, batch_size: int):
    """(episodes, their rewards [N, K]) of `rows` in chunks of batch_size rows, row i seeded i."""
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        episodes = source.rollout(chunk, list(range(i, i + len(chunk))))
        yield episodes, score(reward, chunk, episodes)


def _failures(reward: RewardRunner, name: str, episodes) -> int:
    if name in reward.last_errors:
        return reward.last_errors[name]
    if "env_errors" in episodes.info:  # an environment's get_reward(): its failures are the episodes' environment errors
        return int(episodes.info["env_errors"].sum())
    if episodes.valid is not None:  # another reward the rollout gave (an agent's): episodes it could not make
        return int((~episodes.valid).sum())
    return 0


def _sampled_numbers(outcome: EvalOutcome, per: torch.Tensor, answers: list) -> None:
    """avg@n with its interval; pass@k for k = 1, 2, 4, ... <= n when every reward is 0 or 1; maj@n with answers."""
    n, binary = per.shape[1], bool(((per == 0) | (per == 1)).all())
    outcome.avg = Interval(*mean_interval(per.mean(-1), unit=bool(((per >= 0) & (per <= 1)).all())))
    if binary:
        outcome.pass_at = {k: Interval(*mean_interval(pass_at_k(per, k))) for k in powers_of_two_up_to(n)}
        if answers:
            grouped = [answers[j : j + n] for j in range(0, len(answers), n)]
            outcome.maj = Interval(*mean_interval(majority_correct(grouped, per)))
