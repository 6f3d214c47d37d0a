"""What the doctor's rules read from a run's metric history, beyond one metric's curve: how groups
with identical rewards split between solved and failed, whether the policy still explores, how
often each reward function fails, how many completions are cut short.

Identical rewards within groups are a symptom with several causes; telling them apart needs these
facts side by side (rlvr.observe.doctor names the cause). All functions are pure, over the list of
metric dicts of `metrics.jsonl`, oldest first.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def num(v) -> float:
    """A metric value as float; JSON null (NaN written by the logger) and "inf" strings included."""
    if v is None:
        return math.nan
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return math.nan
    return float(v)


def step_of(m: dict, i: int) -> int:
    return int(m.get("step", i + 1))


def series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, skipping steps where it is absent or not finite."""
    steps, values = [], []
    for i, m in enumerate(history):
        if key in m:
            v = num(m[key])
            if math.isfinite(v):
                steps.append(step_of(m, i))
                values.append(v)
    return steps, values


def fmt(steps: list[int], values: list[float], limit: int = 6) -> str:
    pairs = [f"step {s}: {v:.4g}" for s, v in zip(steps, values)]
    if len(pairs) > limit:
        pairs = pairs[: limit // 2] + ["..."] + pairs[-(limit // 2) :]
    return ", ".join(pairs)


def _ends(values: list[float], k: int = 3) -> tuple[float, float]:
    """(mean of the first k, mean of the last k)."""
    return statistics.fmean(values[:k]), statistics.fmean(values[-k:])


# ------------------------------------------------------------------------- identical-reward groups


@dataclass
class IdenticalGroups:
    """Groups whose completions all got the same reward, over the recent window: their share
    (`zero`) and how much of it sat at the step's top reward (`top`: solved) or bottom (`bottom`:
    failed). A collapsed policy shows both: each group repeats one answer, right or wrong."""

    steps: list[int]
    zero: list[float]
    top: list[float]
    bottom: list[float]
    every_step: bool  # every group identical in every step so far
    estimated: bool  # top/bottom guessed from the mean reward (runs that did not log them)

    @property
    def share(self) -> float:
        return statistics.fmean(self.zero)

    @property
    def top_share(self) -> float:
        return statistics.fmean(self.top)

    @property
    def bottom_share(self) -> float:
        return statistics.fmean(self.bottom)

    def describe(self) -> str:
        where = f"steps {self.steps[0]}-{self.steps[-1]}" if len(self.steps) > 1 else f"step {self.steps[0]}"
        guessed = " (split guessed from the mean reward: the run did not log frac_reward_zero_std/top)" if self.estimated else ""
        return (
            f"{self.share:.0%} of groups had identical rewards ({where}): {self.top_share:.0%} of groups all at the step's top "
            f"reward, {self.bottom_share:.0%} all at its bottom{guessed}"
        )


def identical_groups(history: list[dict], window: int) -> IdenticalGroups | None:
    """The last `window` steps that logged frac_reward_zero_std; None when no step did."""
    rows = [(step_of(m, i), m) for i, m in enumerate(history) if math.isfinite(num(m.get("frac_reward_zero_std")))]
    if not rows:
        return None
    every_step = all(num(m["frac_reward_zero_std"]) >= 1.0 for _, m in rows)
    steps, zero, top, bottom, estimated = [], [], [], [], False
    for s, m in rows[-window:]:
        z = num(m["frac_reward_zero_std"])
        t, b = num(m.get("frac_reward_zero_std/top")), num(m.get("frac_reward_zero_std/bottom"))
        if not (math.isfinite(t) and math.isfinite(b)) or t + b > z + 1e-9:
            # Not logged, or every reward of the step was equal (top = bottom): the reward level decides.
            estimated = estimated or not (math.isfinite(t) and math.isfinite(b))
            t, b = (z, 0.0) if num(m.get("reward")) > 0.5 else (0.0, z)
        steps.append(s)
        zero.append(z)
        top.append(t)
        bottom.append(b)
    return IdenticalGroups(steps, zero, top, bottom, every_step, estimated)


# ----------------------------------------------------------------------------------- exploration


@dataclass
class Exploration:
    """Whether the policy still samples different answers: token entropy (over all sampled tokens)
    and the share of distinct completions per group, early (first 3 steps) against recent (last 3)."""

    entropy: tuple[float, float] | None  # (early, recent); None: not logged or too few steps
    distinct: tuple[float, float] | None
    entropy_collapsed: bool
    distinct_collapsed: bool
    entropy_series: tuple[list[int], list[float]]
    distinct_series: tuple[list[int], list[float]]

    @property
    def collapsed(self) -> bool:
        return self.entropy_collapsed or self.distinct_collapsed

    def describe(self) -> str:
        parts = []
        if self.entropy:
            parts.append(f"token entropy {self.entropy[0]:.3g} -> {self.entropy[1]:.3g} nats")
        if self.distinct:
            parts.append(f"distinct completions per group {self.distinct[0]:.0%} -> {self.distinct[1]:.0%}")
        return ", ".join(parts) or "no entropy or distinct-completion metrics logged"


def exploration(
    history: list[dict], *, min_steps: int, entropy_ratio: float, entropy_floor: float, distinct_ratio: float, distinct_floor: float
) -> Exploration:
    """Collapsed: entropy fell below `entropy_ratio` of its start and below `entropy_floor`, or the
    distinct-completion share fell below `distinct_ratio` of its start and below `distinct_floor`.
    Both are drops, not levels: a short-answer task repeats itself from the first step and is fine."""
    # Before entropy covered every sampled token, a step that trained nothing (every group identical)
    # logged entropy 0; such steps say nothing about exploration.
    trained = [m for m in history if not (num(m.get("entropy")) == 0.0 and num(m.get("frac_reward_zero_std")) >= 1.0)]
    ent, dis = series(trained, "entropy"), series(history, "distinct_completions")
    e = _ends(ent[1]) if len(ent[1]) >= min_steps else None
    d = _ends(dis[1]) if len(dis[1]) >= min_steps else None
    e_collapsed = e is not None and e[0] > 0 and e[1] < entropy_ratio * e[0] and e[1] < entropy_floor
    d_collapsed = d is not None and d[1] < distinct_ratio * d[0] and d[1] < distinct_floor
    return Exploration(e, d, e_collapsed, d_collapsed, ent, dis)


# -------------------------------------------------------------------------------- reward failures


@dataclass
class RewardFailure:
    name: str
    steps: list[int]
    rates: list[float]  # share of the step's samples whose call failed (NaN: unknown)
    counts: list[float]  # failed samples per step (NaN: not logged)

    @property
    def rate(self) -> float:
        known = [r for r in self.rates if math.isfinite(r)]
        return statistics.fmean(known) if known else math.nan


def reward_failures(history: list[dict], window: int, *, group_size: int | None, prompts_per_step: int | None) -> list[RewardFailure]:
    """Per reward function, over the last `window` steps: the share of samples whose call failed,
    from `rewards/<name>/error_rate`, else `rewards/<name>/errors` over the step's samples
    (`sampling/prompts_consumed` x group size with dynamic sampling, else prompts_per_step x group size)."""
    names: list[str] = []
    for m in history:
        for k in m:
            for tail in ("/error_rate", "/errors"):
                if k.startswith("rewards/") and k.endswith(tail) and (n := k[len("rewards/") : -len(tail)]) not in names:
                    names.append(n)
    out = []
    recent = list(enumerate(history))[-window:]
    for n in names:
        steps, rates, counts = [], [], []
        for i, m in recent:
            count = num(m.get(f"rewards/{n}/errors"))
            rate = num(m.get(f"rewards/{n}/error_rate"))
            if not math.isfinite(rate) and math.isfinite(count):
                prompts = num(m.get("sampling/prompts_consumed", prompts_per_step))
                rate = count / (prompts * group_size) if group_size and math.isfinite(prompts) and prompts > 0 else math.nan
            if math.isfinite(rate) or math.isfinite(count):
                steps.append(step_of(m, i))
                rates.append(rate)
                counts.append(count)
        if steps:
            out.append(RewardFailure(n, steps, rates, counts))
    return out
