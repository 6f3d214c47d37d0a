"""`rlvr doctor`: rules that read a run's metrics and say what is wrong and which setting to change.

Every rule is a pure function `rule(history, ctx) -> Finding | None` over the list of metric dicts
of `metrics.jsonl` (oldest first), registered in `RULES` by name. The same rules run during
training every `logging.doctor_every` steps (as warnings) and after it (`rlvr doctor RUN_DIR`).

A finding names the metric, the evidence (steps and values) and the setting to change. Thresholds
live in `Thresholds`, so a test or a user can tighten or loosen any of them.

Identical rewards within groups (no learning signal) are a symptom, not a cause. The rules in CAUSES
name its causes, each checking the facts that rule out the others (rlvr.observe.signals): a reward
function failing (`reward_failing`) comes first; completions cut at the token limit
(`truncation`); a policy that stopped exploring (`entropy_collapse`); and only while the policy
still explores, prompts too easy or too hard, or both at once (`prompts_split`). When two causes
fit, each finding says so.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rlvr.observe.run_files import read_config, read_metrics
from rlvr.observe.signals import (
    Exploration,
    IdenticalGroups,
    RewardFailure,
    exploration,
    fmt,
    identical_groups,
    num,
    reward_failures,
    series,
    step_of,
)

__all__ = ["RULES", "Context", "Finding", "LiveDoctor", "Thresholds", "diagnose", "diagnose_run", "num", "series"]

# Names that mark a reward function as the correctness reward (what the run is really for).
_CORRECTNESS = re.compile(r"correct|accura|exact|match|answer|arithmetic|math|pass|test|verif|solve", re.I)


@dataclass
class Thresholds:
    window: int = 10
    """Recent steps that the 'persistently' rules look at."""
    min_steps: int = 5
    """Fewer logged steps than this: the trend rules stay silent (not enough evidence)."""
    zero_std_frac: float = 0.6
    """Mean frac_reward_zero_std over the window above this: too many groups give no signal."""
    side_share: float = 0.3
    """Share of all groups identical at the step's top (bottom) reward to call the prompts too easy (too hard)."""
    clip_ratio: float = 0.2
    """clip_ratio/region_mean above this in most of the window: updates are too large."""
    clip_persist: float = 0.8
    """Share of the window's steps that must be above `clip_ratio`."""
    entropy_ratio: float = 0.15
    """Recent entropy (last 3 steps) below this share of the early entropy (first 3) ..."""
    entropy_floor: float = 0.1
    """... and below this many nats per token: entropy collapse."""
    distinct_ratio: float = 0.5
    """Or: the share of distinct completions per group fell below this share of its start ..."""
    distinct_floor: float = 0.35
    """... and below this share: entropy collapse (the policy repeats one completion per prompt)."""
    reward_drop: float = 0.5
    """Correctness reward (last 3 steps) below this share of its best 3-step mean, and down by ... """
    reward_drop_min: float = 0.1
    """... at least this much: training made the policy worse (reward collapse)."""
    reward_error_rate: float = 0.05
    """A reward function that failed on more than this share of the window's samples: reward failing."""
    truncated: float = 0.5
    """completions/clipped_ratio above this over the window, with many groups failed alike: truncation ..."""
    truncation_gap: float = 0.05
    """... unless completions that ended scored no more than this above the cut ones (the cut is then not why they fail)."""
    kl_max: float = 0.5
    """Recent mean KL (per token) above this: the policy runs away from the reference."""
    kl_growth: float = 10.0
    """KL grown this many times over the window (and above kl_max / 5): KL runaway."""
    length_growth: float = 0.25
    """Mean completion length up by this share (late third vs early third) ..."""
    length_min_tokens: float = 4.0
    """... and by at least this many tokens ..."""
    flat_correctness: float = 0.02
    """... while the correctness reward rose by less than this: length bias."""
    hack_rise: float = 0.15
    """Another reward up by this much (late vs early third) while correctness stays flat."""
    grad_spike: float = 10.0
    """grad_norm this many times the median of the preceding window: a spike."""
    wait_share: float = 0.3
    """With generation apart (rollout.max_staleness > 0): the trainer waiting for rollouts, or the generators waiting for
    weights, this share of the step time over the window: one side starves the other."""


@dataclass
class Finding:
    rule: str
    metric: str
    message: str  # what is wrong, in words
    evidence: str  # steps and values
    fix: str  # the setting(s) to change
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    severity: str = "warning"  # warning | error

    def __str__(self) -> str:
        return f"[{self.severity}] {self.rule} ({self.metric}): {self.message}\n    evidence: {self.evidence}\n    fix: {self.fix}"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("rule", "metric", "severity", "message", "evidence", "fix", "steps", "values")}


@dataclass
class Context:
    """What the rules know besides the metrics: thresholds, the run's config (to quote current
    settings), and which reward function measures correctness."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    config: dict = field(default_factory=dict)
    correctness: str | None = None  # reward function name; None: guessed from the metric names

    def setting(self, dotted: str, default="?"):
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def now(self, dotted: str) -> str:
        """ " (now X)" quoting the run's current value of a setting; "" when the config does not have it."""
        value = self.setting(dotted, _MISSING)
        return "" if value is _MISSING else f" (now {value})"


_MISSING = object()


Rule = Callable[[list[dict], Context], "Finding | None"]
RULES: dict[str, Rule] = {}

# The rules that name a cause of identical rewards within groups; diagnose() tells each finding
# which others fit too (too easy and too hard together are one split prompt set: prompts_split).
CAUSES = ("reward_failing", "truncation", "entropy_collapse", "reward_collapse", "prompts_too_easy", "prompts_too_hard", "prompts_split")


def rule(name: str):
    def register(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return register


# --------------------------------------------------------------------------------------- helpers


def _thirds(values: list[float]) -> tuple[float, float]:
    k = max(1, len(values) // 3)
    return statistics.fmean(values[:k]), statistics.fmean(values[-k:])


def reward_names(history: list[dict]) -> list[str]:
    names = []
    for m in history[:1] + history[-1:]:
        for k in m:
            if k.startswith("rewards/") and k.endswith("/mean"):
                n = k[len("rewards/") : -len("/mean")]
                if n not in names:
                    names.append(n)
    return names


def correctness_reward(history: list[dict], ctx: Context) -> str | None:
    """The reward function that measures correctness: ctx.correctness, else the first whose name
    looks like it (correct, accuracy, math, ...), else the first; None if there are none."""
    names = reward_names(history)
    if ctx.correctness:
        return ctx.correctness if ctx.correctness in names else None
    for n in names:
        if _CORRECTNESS.search(n):
            return n
    return names[0] if names else None


def _correctness_series(history: list[dict], ctx: Context) -> tuple[str, list[int], list[float]]:
    name = correctness_reward(history, ctx)
    key = f"rewards/{name}/mean" if name else "reward"
    return key, *series(history, key)


def _exploration(history: list[dict], ctx: Context) -> Exploration:
    t = ctx.thresholds
    return exploration(
        history,
        min_steps=t.min_steps,
        entropy_ratio=t.entropy_ratio,
        entropy_floor=t.entropy_floor,
        distinct_ratio=t.distinct_ratio,
        distinct_floor=t.distinct_floor,
    )


def _failing_rewards(history: list[dict], ctx: Context) -> list[RewardFailure]:
    """Reward functions that failed on more than `reward_error_rate` of the recent samples (or, where
    the share cannot be known, failed in every recent step), worst first; two steps at least."""

    def size(key):
        v = ctx.setting(key, None)
        return v if isinstance(v, int) else None

    t = ctx.thresholds
    fails = reward_failures(history, t.window, group_size=size("rollout.group_size"), prompts_per_step=size("rollout.prompts_per_step"))
    bad = [
        f for f in fails if len(f.steps) >= 2 and (f.rate > t.reward_error_rate if math.isfinite(f.rate) else all(c > 0 for c in f.counts))
    ]
    return sorted(bad, key=lambda f: -f.rate if math.isfinite(f.rate) else 0.0)


def _groups(history: list[dict], ctx: Context) -> IdenticalGroups | None:
    """The recent identical-reward groups when they are many enough to matter, else None."""
    t = ctx.thresholds
    g = identical_groups(history, t.window)
    if g is None or g.share <= t.zero_std_frac:
        return None
    logged = len(series(history, "frac_reward_zero_std")[0])
    return g if logged >= t.min_steps or (g.every_step and logged >= 3) else None


@dataclass
class _Truncation:
    steps: list[int]
    clipped: list[float]  # completions/clipped_ratio
    groups: IdenticalGroups
    gap: tuple[float, float] | None  # mean reward of (ended, cut) completions; None: unknown (all cut, or not logged)


def _truncated(history: list[dict], ctx: Context) -> _Truncation | None:
    """Most completions cut at the token limit while many groups fail alike, and the ones that
    ended scored better than the cut ones (or none ended, or it was not logged: then it may be)."""
    t = ctx.thresholds
    steps, clipped = series(history, "completions/clipped_ratio")
    g = _groups(history, ctx)
    if len(clipped) < 3 or g is None or g.bottom_share < t.side_share:
        return None
    steps, clipped = steps[-t.window :], clipped[-t.window :]
    if statistics.fmean(clipped) <= t.truncated:
        return None
    ended = series(history[-t.window :], "completions/terminated_reward_mean")[1]
    cut = series(history[-t.window :], "completions/clipped_reward_mean")[1]
    gap = (statistics.fmean(ended), statistics.fmean(cut)) if ended and cut else None
    if gap is not None and gap[0] <= gap[1] + t.truncation_gap:
        return None  # completions that ended fail as often: the limit is not the cause
    return _Truncation(steps, clipped, g, gap)


def _reward_fell(history: list[dict], ctx: Context) -> tuple[str, list[int], list[float], float, float] | None:
    """(metric, steps, values, best 3-step mean, last 3-step mean) when the correctness reward fell
    far below the best it reached: the policy got worse, so the prompts are not what is too hard."""
    t = ctx.thresholds
    key, steps, values = _correctness_series(history, ctx)
    if len(values) < t.min_steps:
        return None
    best = max(statistics.fmean(values[i : i + 3]) for i in range(len(values) - 3))
    recent = statistics.fmean(values[-3:])
    if recent < t.reward_drop * best and best - recent >= t.reward_drop_min:
        return key, steps, values, best, recent
    return None


def _sampling_fix(ctx: Context) -> str:
    if ctx.setting("algo.dynamic_sampling", False) is True:
        return "; dynamic sampling is on: raise algo.max_resample_rounds" + ctx.now("algo.max_resample_rounds")
    return ", or set algo.dynamic_sampling=true (drops such groups and draws fresh prompts)"


# ----------------------------------------------------------------------------------------- rules


@rule("reward_failing")
def reward_failing(history: list[dict], ctx: Context) -> Finding | None:
    """A reward function raised, timed out or returned garbage on many samples: its groups score
    alike (NaN, not applicable) and look like prompts that are too hard. Checked before those."""
    bad = _failing_rewards(history, ctx)
    if not bad:
        return None
    worst = bad[0]
    share = f"{worst.rate:.0%} of samples" if math.isfinite(worst.rate) else f"{statistics.fmean(worst.counts):.0f} samples per step"
    where = f"steps {worst.steps[0]}-{worst.steps[-1]}"
    others = "".join(
        f"; reward {f.name!r} failed on {f.rate:.0%}" if math.isfinite(f.rate) else f"; reward {f.name!r} failed too" for f in bad[1:]
    )
    g = identical_groups(history, ctx.thresholds.window)
    groups = f"; {g.describe()}" if g is not None and g.share > ctx.thresholds.zero_std_frac else ""
    rates = worst.rates if math.isfinite(worst.rate) else worst.counts
    return Finding(
        "reward_failing",
        f"rewards/{worst.name}/error_rate",
        f"reward {worst.name!r} failed on {share} ({where}){others}{groups}: failed samples get no reward, "
        "so the groups look alike for a reason that has nothing to do with the prompts",
        fmt(worst.steps, rates) + f" ({'share of samples failed' if math.isfinite(worst.rate) else 'failed samples'}; "
        f"counts in rewards/{worst.name}/errors)",
        f"fix reward {worst.name!r}: its first error is in the run's log ('reward function {worst.name!r} failed'); "
        "call it by hand on a few rows of your data and their completions (samples.jsonl) to reproduce it",
        worst.steps,
        rates,
        severity="error" if math.isfinite(worst.rate) and worst.rate >= 0.5 else "warning",
    )


@rule("truncation")
def truncation(history: list[dict], ctx: Context) -> Finding | None:
    """Most completions hit rollout.max_new_tokens and many groups fail alike: the answers never arrive."""
    hit = _truncated(history, ctx)
    if hit is None or _failing_rewards(history, ctx):
        return None
    steps, clipped = hit.steps, hit.clipped
    if hit.gap is not None:
        why = (
            f"completions that ended scored {hit.gap[0]:.3g} on average, cut ones {hit.gap[1]:.3g}: "
            "the answers are cut off before they arrive"
        )
    else:
        why = (
            "the answers may be cut off before they arrive "
            "(the prompts may also be too hard: no completion ended, so only a longer limit can tell)"
        )
    return Finding(
        "truncation",
        "completions/clipped_ratio",
        f"{statistics.fmean(clipped):.0%} of completions were cut at rollout.max_new_tokens{ctx.now('rollout.max_new_tokens')} "
        f"and {hit.groups.describe()}; {why}",
        fmt(steps, clipped),
        f"raise rollout.max_new_tokens{ctx.now('rollout.max_new_tokens')}, ask for shorter answers in the prompt, "
        f"or leave cut completions out of the loss (algo.mask_truncated_completions=true{ctx.now('algo.mask_truncated_completions')})",
        steps,
        clipped,
    )


@rule("entropy_collapse")
def entropy_collapse(history: list[dict], ctx: Context) -> Finding | None:
    """The policy stopped exploring: token entropy over all sampled tokens, or the share of distinct
    completions per group, fell to a small fraction of its start. Groups then repeat one answer and
    score alike whether the prompts are easy or hard."""
    x = _exploration(history, ctx)
    if not x.collapsed:
        return None
    metric = "entropy" if x.entropy_collapsed else "distinct_completions"
    steps, values = x.entropy_series if x.entropy_collapsed else x.distinct_series
    message = f"the policy stopped exploring: {x.describe()}"
    g = _groups(history, ctx)
    if g is not None:
        message += f"; {g.describe()}: groups repeat one answer"
        if g.bottom_share >= 0.1 * g.share:
            message += f" (the identical groups are not all solved: {g.bottom_share:.0%} of groups got the step's lowest reward)"
        if g.top_share >= 0.8 * g.share:
            message += (
                "; most identical groups were all right, so the prompts may also simply be solved (two causes fit: "
                "prompts_too_easy, if held-out accuracy matches the training reward)"
            )
    return Finding(
        "entropy_collapse",
        metric,
        message,
        fmt(steps, values),
        f"{_controller_fix(x, history, ctx)}, {_clip_cov_fix(ctx)}, "
        f"raise rollout.temperature{ctx.now('rollout.temperature')}, widen the clip's high side "
        f"(algo.epsilon_high=0.28{ctx.now('algo.epsilon_high')}), "
        f"or lower optim.lr{ctx.now('optim.lr')}",
        steps,
        values,
    )


def _controller_fix(x, history: list[dict], ctx: Context) -> str:
    """Turn the adaptive controller on, or (it was on and the entropy still fell) let it act sooner and harder."""
    if ctx.setting("algo.adaptive_entropy", False) is not True:
        return (
            f"keep the entropy up with the adaptive controller (algo.adaptive_entropy=true{ctx.now('algo.adaptive_entropy')}: "
            f"its automatic target is half the entropy of the first 5 steps, here about {_target(x)})"
        )
    coefs = [h["entropy_coef"] for h in history if isinstance(h.get("entropy_coef"), (int, float))]
    reached = f", its coefficient reached {max(coefs):.3g}" if coefs else ""
    return (
        f"the adaptive controller was on{reached}: let it act sooner and harder (algo.entropy_coef_delta, e.g. 0.05"
        f"{ctx.now('algo.entropy_coef_delta')}; algo.entropy_target={_target(x)}, half the entropy this run started at"
        f"{ctx.now('algo.entropy_target')}; algo.entropy_coef_max{ctx.now('algo.entropy_coef_max')})"
    )


def _clip_cov_fix(ctx: Context) -> str:
    """Clip-Cov at 2 % of tokens: the remedy measured to keep SmolLM2 exploring without losing held-out accuracy."""
    ratio = ctx.setting("algo.clip_cov_ratio", 0.0)
    if isinstance(ratio, (int, float)) and ratio > 0:
        more = f"{2 * ratio:.3g}{ctx.now('algo.clip_cov_ratio')}"
        return f"Clip-Cov was on: detach more of the tokens that drive the collapse (algo.clip_cov_ratio, e.g. {more})"
    return (
        f"detach the gradient of the tokens that drive the collapse with Clip-Cov (algo.clip_cov_ratio=0.02"
        f"{ctx.now('algo.clip_cov_ratio')}: measured to keep SmolLM2 exploring at no held-out cost, "
        "bench/results/exploration_smollm2_clipcov_skip.md)"
    )


def _target(x) -> str:
    """An entropy target for the adaptive controller: half the run's early entropy (TRL's default 0.2 when not logged)."""
    return f"{max(0.05, x.entropy[0] / 2):.2g}" if x.entropy else "0.2"


@rule("reward_collapse")
def reward_collapse(history: list[dict], ctx: Context) -> Finding | None:
    """The correctness reward fell far below the best it reached: the updates broke the policy (a too
    high learning rate most often), which then fails prompts it used to solve."""
    fell = _reward_fell(history, ctx)
    if fell is None:
        return None
    key, steps, values, best, recent = fell
    g = _groups(history, ctx)
    return Finding(
        "reward_collapse",
        key,
        f"{key} fell from {best:.3g} (its best 3-step mean) to {recent:.3g}: training made the policy worse; it now fails "
        "prompts it used to solve" + (f" ({g.describe()})" if g is not None else ""),
        fmt(steps, values),
        f"lower optim.lr{ctx.now('optim.lr')}, keep optim.max_grad_norm{ctx.now('optim.max_grad_norm')}, add a KL penalty "
        f"(algo.beta=0.04{ctx.now('algo.beta')}); resume from a checkpoint saved before the fall",
        steps,
        values,
        severity="error",
    )


def _difficulty(history: list[dict], ctx: Context, side: str) -> Finding | None:
    """Prompts too easy (side="top") or too hard ("bottom"): many groups identical at that side of
    the reward range while the policy still explores and every reward function works."""
    t = ctx.thresholds
    g = _groups(history, ctx)
    if g is None or (g.top_share if side == "top" else g.bottom_share) < t.side_share:
        return None
    explores = _exploration(history, ctx)
    if _failing_rewards(history, ctx) or explores.collapsed:
        return None
    if side == "bottom" and (cut := _truncated(history, ctx)) and cut.gap is not None:
        return None  # the cut is why they fail; when that cannot be known, both causes are named
    if side == "bottom" and _reward_fell(history, ctx):
        return None  # they were solved before: the policy got worse
    rule_name = "prompts_too_easy" if side == "top" else "prompts_too_hard"
    what = "too easy (every completion got the top reward)" if side == "top" else "too hard (every completion got the lowest reward)"
    if g.every_step:
        message = (
            f"every group had identical rewards in all {len(series(history, 'frac_reward_zero_std')[0])} steps so far "
            f"(zero advantages, no update): prompts look {what}; the policy still explores ({explores.describe()})"
        )
    else:
        message = f"{g.describe()}, and give no gradient: prompts look {what}; the policy still explores ({explores.describe()})"
    if side == "top":
        fix = "filter out prompts the model always solves (difficulty filtering) or use harder ones"
    else:
        fix = (
            f"filter out prompts never solved, use easier ones or a curriculum, raise rollout.group_size{ctx.now('rollout.group_size')}; "
            "check in samples.jsonl that right answers do get the reward"
        )
    return Finding(rule_name, "frac_reward_zero_std", message, fmt(g.steps, g.zero), fix + _sampling_fix(ctx), g.steps, g.zero)


def _split(history: list[dict], ctx: Context) -> tuple[Finding, Finding] | None:
    """(too easy, too hard) when both fit: then the set is split and neither finding alone is right."""
    easy, hard = _difficulty(history, ctx, "top"), _difficulty(history, ctx, "bottom")
    return (easy, hard) if easy is not None and hard is not None else None


@rule("prompts_too_easy")
def prompts_too_easy(history: list[dict], ctx: Context) -> Finding | None:
    """Most groups all right (identical at the step's top reward) while the policy still explores."""
    return None if _split(history, ctx) else _difficulty(history, ctx, "top")


@rule("prompts_too_hard")
def prompts_too_hard(history: list[dict], ctx: Context) -> Finding | None:
    """Most groups all wrong (identical at the step's lowest reward) while the policy still explores,
    every reward function works and completions are not cut short."""
    return None if _split(history, ctx) else _difficulty(history, ctx, "bottom")


@rule("prompts_split")
def prompts_split(history: list[dict], ctx: Context) -> Finding | None:
    """Prompts too easy and too hard at once: a split set, some always solved and others never. Harder
    or easier prompts would each fix one half; keeping the prompts in between fixes both."""
    if (both := _split(history, ctx)) is None:
        return None
    g, explores = _groups(history, ctx), _exploration(history, ctx)
    assert g is not None, "_split found prompts too easy and too hard, each of which needs the groups"
    if ctx.setting("algo.dynamic_sampling", False) is True:
        sampling = "; dynamic sampling is on: raise algo.max_resample_rounds" + ctx.now("algo.max_resample_rounds")
    else:
        sampling = (
            "; or set algo.dynamic_sampling=true, which drops groups whose rewards are all equal (both kinds) "
            "and draws fresh prompts in their place"
        )
    return Finding(
        "prompts_split",
        "frac_reward_zero_std",
        f"{g.describe()}, and give no gradient: the prompt set is split, some prompts always solved and others never "
        f"(not too easy or too hard as a whole); the policy still explores ({explores.describe()})",
        both[0].evidence,
        "keep the prompts in between: filter the data by difficulty (sample a few completions per prompt, drop the prompts "
        "that all or none of them solve) or order it as a curriculum" + sampling,
        both[0].steps,
        both[0].values,
    )


@rule("clip_high")
def clip_high(history: list[dict], ctx: Context) -> Finding | None:
    """The clipped share of tokens stays high: each update moves the policy too far."""
    t = ctx.thresholds
    steps, values = series(history, "clip_ratio/region_mean")
    if len(values) < t.min_steps:
        return None
    steps, values = steps[-t.window :], values[-t.window :]
    high = [v > t.clip_ratio for v in values]
    if sum(high) < t.clip_persist * len(values):
        return None
    return Finding(
        "clip_high",
        "clip_ratio/region_mean",
        f"{sum(high)} of the last {len(values)} steps clipped more than {t.clip_ratio:.0%} of tokens: "
        "the learning rate is too high for this model",
        fmt(steps, values),
        f"lower optim.lr (now {ctx.setting('optim.lr')}), or use fewer algo.num_iterations (now {ctx.setting('algo.num_iterations')})",
        steps,
        values,
    )


@rule("kl_runaway")
def kl_runaway(history: list[dict], ctx: Context) -> Finding | None:
    """KL to the reference grows without bound (only when a KL penalty is on)."""
    t = ctx.thresholds
    steps, values = series(history, "kl")
    if len(values) < t.min_steps:
        return None
    recent = statistics.fmean(values[-3:])
    window = values[-t.window :]
    base = max(min(window[:3]), 1e-12)
    grew = recent > t.kl_growth * base and recent > t.kl_max / 5
    if recent <= t.kl_max and not grew:
        return None
    s, v = steps[-t.window :], values[-t.window :]
    return Finding(
        "kl_runaway",
        "kl",
        f"KL to the reference model reached {recent:.3g} per token"
        + (f" ({recent / base:.0f}x within {len(window)} steps)" if grew else ""),
        fmt(s, v),
        f"raise algo.beta (now {ctx.setting('algo.beta')}) or lower optim.lr (now {ctx.setting('optim.lr')})",
        s,
        v,
    )


@rule("length_bias")
def length_bias(history: list[dict], ctx: Context) -> Finding | None:
    """Completions grow longer while correctness does not improve."""
    t = ctx.thresholds
    steps, lengths = series(history, "completions/mean_length")
    key, _, correct = _correctness_series(history, ctx)
    if len(lengths) < 2 * t.min_steps or len(correct) < 2 * t.min_steps:
        return None
    l0, l1 = _thirds(lengths)
    c0, c1 = _thirds(correct)
    if not (l1 - l0 >= t.length_min_tokens and l1 > (1 + t.length_growth) * l0 and c1 - c0 < t.flat_correctness):
        return None
    return Finding(
        "length_bias",
        "completions/mean_length",
        f"mean completion length rose from {l0:.1f} to {l1:.1f} tokens while {key} went from {c0:.3f} to {c1:.3f}: "
        "longer answers are not more correct (length bias)",
        fmt(steps, lengths),
        f"use a length-unbiased loss: algo.loss_type=dr_grpo or dapo (now {ctx.setting('algo.loss_type')}); "
        "consider algo.mask_truncated_completions=true or a length penalty reward",
        steps,
        lengths,
    )


@rule("reward_hacking")
def reward_hacking(history: list[dict], ctx: Context) -> Finding | None:
    """Some reward rises while the correctness reward stays flat: that reward is being gamed."""
    t = ctx.thresholds
    names = reward_names(history)
    correct = correctness_reward(history, ctx)
    if len(names) < 2 or correct is None:
        return None
    _, _, cv = _correctness_series(history, ctx)
    if len(cv) < 2 * t.min_steps:
        return None
    c0, c1 = _thirds(cv)
    if c1 - c0 >= t.flat_correctness:
        return None
    worst = None
    for n in names:
        if n == correct:
            continue
        steps, values = series(history, f"rewards/{n}/mean")
        if len(values) < 2 * t.min_steps:
            continue
        v0, v1 = _thirds(values)
        if v1 - v0 > t.hack_rise and (worst is None or v1 - v0 > worst[0]):
            worst = (v1 - v0, n, steps, values, v0, v1)
    if worst is None:
        return None
    _, n, steps, values, v0, v1 = worst
    idx = names.index(n)
    return Finding(
        "reward_hacking",
        f"rewards/{n}/mean",
        f"reward {n!r} rose from {v0:.3f} to {v1:.3f} while the correctness reward {correct!r} stayed at {c0:.3f} -> {c1:.3f}: "
        "the model is likely gaming that reward",
        fmt(steps, values),
        f"read samples.jsonl for completions that score on {n!r} but not on {correct!r}; tighten that reward "
        f"or lower its weight (rewards.{idx}.weight)",
        steps,
        values,
    )


_MUST_BE_FINITE = ("loss", "grad_norm", "entropy", "kl", "reward", "reward_std", "learning_rate", "completions/mean_length")


@rule("non_finite")
def non_finite(history: list[dict], ctx: Context) -> Finding | None:
    """NaN or inf in the loss, gradient norm, entropy, KL or rewards."""
    hits: list[tuple[int, str, str]] = []
    for i, m in enumerate(history):
        for k in _MUST_BE_FINITE:
            if k in m and not math.isfinite(num(m[k])):
                hits.append((int(m.get("step", i + 1)), k, "NaN" if m[k] is None else str(m[k])))
    if not hits:
        return None
    metrics = sorted({k for _, k, _ in hits})
    shown = ", ".join(f"step {s}: {k}={v}" for s, k, v in hits[:6]) + (" ..." if len(hits) > 6 else "")
    return Finding(
        "non_finite",
        metrics[0],
        f"{len({s for s, _, _ in hits})} step(s) had non-finite {', '.join(metrics)} (such updates are skipped)",
        shown,
        f"lower optim.lr (now {ctx.setting('optim.lr')}), keep optim.max_grad_norm > 0 (now {ctx.setting('optim.max_grad_norm')}), "
        f"prefer model.dtype=bfloat16 or float32 over float16 (now {ctx.setting('model.dtype')})",
        [s for s, _, _ in hits],
        [math.nan] * len(hits),
        severity="error",
    )


@rule("grad_spike")
def grad_spike(history: list[dict], ctx: Context) -> Finding | None:
    """A gradient norm many times the recent median (zero-gradient steps are ignored)."""
    t = ctx.thresholds
    steps, values = series(history, "grad_norm")
    pos = [(s, v) for s, v in zip(steps, values) if v > 0]
    spikes = []
    for i in range(t.min_steps, len(pos)):
        prev = [v for _, v in pos[max(0, i - t.window) : i]]
        med = statistics.median(prev)
        if med > 0 and pos[i][1] > t.grad_spike * med:
            spikes.append((pos[i][0], pos[i][1], med))
    if not spikes:
        return None
    return Finding(
        "grad_spike",
        "grad_norm",
        f"{len(spikes)} gradient-norm spike(s) above {t.grad_spike:g}x the median of the preceding steps",
        ", ".join(f"step {s}: {v:.3g} (median {m:.3g})" for s, v, m in spikes[:6]),
        f"lower optim.lr (now {ctx.setting('optim.lr')}), add warm-up (optim.warmup_steps, now {ctx.setting('optim.warmup_steps')}), "
        f"keep optim.max_grad_norm > 0 (now {ctx.setting('optim.max_grad_norm')})",
        [s for s, _, _ in spikes],
        [v for _, v, _ in spikes],
    )


# ------------------------------------------------------------------------------------ entry points


def _wait_share(history: list[dict], ctx: Context, key: str) -> tuple[list[int], list[float]] | None:
    """(steps, share of each step's time spent in `key`) over the window, when it is persistently above wait_share."""
    t = ctx.thresholds
    rows = [
        (step_of(m, i), num(m.get(key)) / num(m.get("time/step")))
        for i, m in enumerate(history)
        if key in m and num(m.get("time/step")) > 0
    ]
    if len(rows) < t.min_steps:
        return None
    rows = rows[1:][-t.window :]  # the first step starts the pipeline: nothing was made ahead yet
    steps, shares = [s for s, _ in rows], [v for _, v in rows]
    return (steps, shares) if shares and statistics.fmean(shares) > t.wait_share else None


@rule("generation_starved")
def generation_starved(history: list[dict], ctx: Context) -> Finding | None:
    """With rollouts made ahead, the trainer still waits for them: generation is the bottleneck."""
    found = _wait_share(history, ctx, "time/waiting_for_rollouts")
    if found is None:
        return None
    steps, shares = found
    servers = ctx.setting("rollout.servers", [])
    return Finding(
        "generation_starved",
        "time/waiting_for_rollouts",
        f"the trainer waited for rollouts {statistics.fmean(shares):.0%} of each step: generation cannot keep up with training",
        fmt(steps, shares),
        f"add generation servers (rollout.servers, now {len(servers) if isinstance(servers, list) else servers}), "
        f"or raise rollout.max_staleness{ctx.now('rollout.max_staleness')} so more batches are made ahead",
        steps,
        shares,
    )


@rule("generators_idle")
def generators_idle(history: list[dict], ctx: Context) -> Finding | None:
    """The generators sit idle waiting for newer weights: training is the bottleneck."""
    found = _wait_share(history, ctx, "time/generator_waiting_for_weights")
    if found is None:
        return None
    steps, shares = found
    return Finding(
        "generators_idle",
        "time/generator_waiting_for_weights",
        f"the generators waited for new weights {statistics.fmean(shares):.0%} of each step: training cannot keep up with generation",
        fmt(steps, shares),
        f"raise rollout.max_staleness{ctx.now('rollout.max_staleness')} to let them run further ahead, or give training "
        f"more processes (nproc{ctx.now('nproc')}) and generation fewer servers",
        steps,
        shares,
    )


def diagnose(history: list[dict], ctx: Context | None = None, *, rules: list[str] | None = None) -> list[Finding]:
    """Every finding of every rule (or of the named ones), errors first."""
    ctx = ctx or Context()
    out = []
    for name, fn in RULES.items():
        if rules is None or name in rules:
            f = fn(history, ctx)
            if f is not None:
                out.append(f)
    causes = [f.rule for f in out if f.rule in CAUSES]
    for f in out:
        rivals = [c for c in causes if c != f.rule]
        if f.rule in CAUSES and rivals:
            f.message += f" [another cause fits too: {', '.join(rivals)}; see that finding]"
    return sorted(out, key=lambda f: f.severity != "error")


def diagnose_run(run_dir: str | Path, *, correctness: str | None = None, thresholds: Thresholds | None = None) -> list[Finding]:
    ctx = Context(thresholds or Thresholds(), read_config(run_dir), correctness)
    return diagnose(read_metrics(run_dir), ctx)


class LiveDoctor:
    """The rules applied during training: `check(history)` returns the findings that are new since
    the previous check (a rule that keeps firing is reported once, again only after it cleared)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.active: set[str] = set()

    def check(self, history: list[dict]) -> list[Finding]:
        found = diagnose(history, self.ctx)
        names = {f.rule for f in found}
        new = [f for f in found if f.rule not in self.active]
        self.active = names
        return new
