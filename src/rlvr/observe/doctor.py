"""`rlvr doctor`: rules that read a run's metrics and say what is wrong and which setting to change.

Every rule is a pure function `rule(history, ctx) -> Finding | None` over the list of metric dicts
of `metrics.jsonl` (oldest first), registered in `RULES` by name. The same rules run during
training every `doctor_every` steps (as warnings) and after it (`rlvr doctor RUN_DIR`).

A finding names the metric, the evidence (steps and values) and the setting to change. Thresholds
live in `Thresholds`, so a test or a user can tighten or loosen any of them.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

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
    clip_ratio: float = 0.2
    """clip_ratio/region_mean above this in most of the window: updates are too large."""
    clip_persist: float = 0.8
    """Share of the window's steps that must be above `clip_ratio`."""
    entropy_ratio: float = 0.1
    """Recent entropy below this share of the early entropy ..."""
    entropy_floor: float = 0.05
    """... and below this many nats per token: entropy collapse."""
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


Rule = Callable[[list[dict], Context], "Finding | None"]
RULES: dict[str, Rule] = {}


def rule(name: str):
    def register(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return register


# --------------------------------------------------------------------------------------- helpers


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


def series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, skipping steps where it is absent or not finite."""
    steps, values = [], []
    for i, m in enumerate(history):
        if key in m:
            v = num(m[key])
            if math.isfinite(v):
                steps.append(int(m.get("step", i + 1)))
                values.append(v)
    return steps, values


def _fmt(steps: list[int], values: list[float], limit: int = 6) -> str:
    pairs = [f"step {s}: {v:.4g}" for s, v in zip(steps, values)]
    if len(pairs) > limit:
        pairs = pairs[: limit // 2] + ["..."] + pairs[-(limit // 2):]
    return ", ".join(pairs)


def _thirds(values: list[float]) -> tuple[float, float]:
    k = max(1, len(values) // 3)
    return statistics.fmean(values[:k]), statistics.fmean(values[-k:])


def reward_names(history: list[dict]) -> list[str]:
    names = []
    for m in history[:1] + history[-1:]:
        for k in m:
            if k.startswith("rewards/") and k.endswith("/mean"):
                n = k[len("rewards/"):-len("/mean")]
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


# ----------------------------------------------------------------------------------------- rules


@rule("no_signal")
def no_signal(history: list[dict], ctx: Context) -> Finding | None:
    """From the first steps on, every group had identical rewards: nothing has been learned."""
    steps, values = series(history, "frac_reward_zero_std")
    if len(values) < 3 or any(v < 1.0 for v in values):
        return None
    _, rewards = series(history, "reward")
    side = "too easy (every completion right)" if rewards and statistics.fmean(rewards) > 0.5 else "too hard (every completion wrong)"
    return Finding(
        "no_signal", "frac_reward_zero_std",
        f"every group had identical rewards in all {len(values)} steps so far: zero advantages, zero update; prompts look {side}",
        _fmt(steps, values),
        "use easier/harder prompts (difficulty filtering), raise rollout.temperature or rollout.group_size, or set algo.dynamic_sampling=true",
        steps, values,
    )


@rule("zero_std")
def zero_std(history: list[dict], ctx: Context) -> Finding | None:
    """Most groups recently had identical rewards (all right or all wrong): little learning signal."""
    t = ctx.thresholds
    steps, values = series(history, "frac_reward_zero_std")
    if len(values) < t.min_steps or all(v >= 1.0 for v in values):
        return None  # all-identical from the start is `no_signal`
    steps, values = steps[-t.window:], values[-t.window:]
    mean = statistics.fmean(values)
    if mean <= t.zero_std_frac:
        return None
    _, rewards = series(history, "reward")
    recent_reward = statistics.fmean(rewards[-t.window:]) if rewards else math.nan
    side = "too easy" if recent_reward > 0.5 else "too hard"
    ds = ctx.setting("algo.dynamic_sampling", False)
    fix = "filter prompts by difficulty (drop those always solved or never solved)"
    fix += ", or set algo.dynamic_sampling=true" if ds is not True else "; dynamic sampling is on: raise algo.max_resample_rounds"
    return Finding(
        "zero_std", "frac_reward_zero_std",
        f"{mean:.0%} of groups (mean over steps {steps[0]}-{steps[-1]}) had identical rewards and give no gradient; "
        f"mean reward {recent_reward:.3f}: prompts look {side}",
        _fmt(steps, values), fix, steps, values,
    )


@rule("clip_high")
def clip_high(history: list[dict], ctx: Context) -> Finding | None:
    """The clipped share of tokens stays high: each update moves the policy too far."""
    t = ctx.thresholds
    steps, values = series(history, "clip_ratio/region_mean")
    if len(values) < t.min_steps:
        return None
    steps, values = steps[-t.window:], values[-t.window:]
    high = [v > t.clip_ratio for v in values]
    if sum(high) < t.clip_persist * len(values):
        return None
    return Finding(
        "clip_high", "clip_ratio/region_mean",
        f"{sum(high)} of the last {len(values)} steps clipped more than {t.clip_ratio:.0%} of tokens: the learning rate is too high for this model",
        _fmt(steps, values),
        f"lower optim.lr (now {ctx.setting('optim.lr')}), or use fewer algo.num_iterations (now {ctx.setting('algo.num_iterations')})",
        steps, values,
    )


@rule("entropy_collapse")
def entropy_collapse(history: list[dict], ctx: Context) -> Finding | None:
    """Token entropy fell to a small fraction of its start: the policy stopped exploring."""
    t = ctx.thresholds
    steps, values = series(history, "entropy")
    if len(values) < t.min_steps:
        return None
    early = statistics.fmean(values[:3])
    recent = statistics.fmean(values[-3:])
    if not (early > 0 and recent < t.entropy_ratio * early and recent < t.entropy_floor):
        return None
    return Finding(
        "entropy_collapse", "entropy",
        f"mean token entropy fell from {early:.3g} to {recent:.3g} nats: the policy has become nearly deterministic and groups stop differing",
        _fmt(steps, values),
        f"raise the clip's high side (algo.epsilon_high=0.28, now {ctx.setting('algo.epsilon_high')}), lower optim.lr (now {ctx.setting('optim.lr')}), "
        f"or raise rollout.temperature (now {ctx.setting('rollout.temperature')})",
        steps, values,
    )


@rule("kl_runaway")
def kl_runaway(history: list[dict], ctx: Context) -> Finding | None:
    """KL to the reference grows without bound (only when a KL penalty is on)."""
    t = ctx.thresholds
    steps, values = series(history, "kl")
    if len(values) < t.min_steps:
        return None
    recent = statistics.fmean(values[-3:])
    window = values[-t.window:]
    base = max(min(window[:3]), 1e-12)
    grew = recent > t.kl_growth * base and recent > t.kl_max / 5
    if recent <= t.kl_max and not grew:
        return None
    s, v = steps[-t.window:], values[-t.window:]
    return Finding(
        "kl_runaway", "kl",
        f"KL to the reference model reached {recent:.3g} per token" + (f" ({recent / base:.0f}x within {len(window)} steps)" if grew else ""),
        _fmt(s, v),
        f"raise algo.beta (now {ctx.setting('algo.beta')}) or lower optim.lr (now {ctx.setting('optim.lr')})",
        s, v,
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
        "length_bias", "completions/mean_length",
        f"mean completion length rose from {l0:.1f} to {l1:.1f} tokens while {key} went from {c0:.3f} to {c1:.3f}: "
        "longer answers are not more correct (length bias)",
        _fmt(steps, lengths),
        f"use a length-unbiased loss: algo.loss_type=dr_grpo or dapo (now {ctx.setting('algo.loss_type')}); "
        "consider algo.mask_truncated_completions=true or a length penalty reward",
        steps, lengths,
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
        "reward_hacking", f"rewards/{n}/mean",
        f"reward {n!r} rose from {v0:.3f} to {v1:.3f} while the correctness reward {correct!r} stayed at {c0:.3f} -> {c1:.3f}: "
        "the model is likely gaming that reward",
        _fmt(steps, values),
        f"read samples.jsonl for completions that score on {n!r} but not on {correct!r}; tighten that reward "
        f"or lower its weight (rewards.{idx}.weight)",
        steps, values,
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
        "non_finite", metrics[0],
        f"{len({s for s, _, _ in hits})} step(s) had non-finite {', '.join(metrics)} (such updates are skipped)",
        shown,
        f"lower optim.lr (now {ctx.setting('optim.lr')}), keep optim.max_grad_norm > 0 (now {ctx.setting('optim.max_grad_norm')}), "
        f"prefer model.dtype=bfloat16 or float32 over float16 (now {ctx.setting('model.dtype')})",
        [s for s, _, _ in hits], [math.nan] * len(hits), severity="error",
    )


@rule("grad_spike")
def grad_spike(history: list[dict], ctx: Context) -> Finding | None:
    """A gradient norm many times the recent median (zero-gradient steps are ignored)."""
    t = ctx.thresholds
    steps, values = series(history, "grad_norm")
    pos = [(s, v) for s, v in zip(steps, values) if v > 0]
    spikes = []
    for i in range(t.min_steps, len(pos)):
        prev = [v for _, v in pos[max(0, i - t.window):i]]
        med = statistics.median(prev)
        if med > 0 and pos[i][1] > t.grad_spike * med:
            spikes.append((pos[i][0], pos[i][1], med))
    if not spikes:
        return None
    return Finding(
        "grad_spike", "grad_norm",
        f"{len(spikes)} gradient-norm spike(s) above {t.grad_spike:g}x the median of the preceding steps",
        ", ".join(f"step {s}: {v:.3g} (median {m:.3g})" for s, v, m in spikes[:6]),
        f"lower optim.lr (now {ctx.setting('optim.lr')}), add warm-up (optim.warmup_steps, now {ctx.setting('optim.warmup_steps')}), "
        f"keep optim.max_grad_norm > 0 (now {ctx.setting('optim.max_grad_norm')})",
        [s for s, _, _ in spikes], [v for _, v, _ in spikes],
    )


# ------------------------------------------------------------------------------------ entry points


def diagnose(history: list[dict], ctx: Context | None = None, *, rules: list[str] | None = None) -> list[Finding]:
    """Every finding of every rule (or of the named ones), errors first."""
    ctx = ctx or Context()
    out = []
    for name, fn in RULES.items():
        if rules is None or name in rules:
            f = fn(history, ctx)
            if f is not None:
                out.append(f)
    return sorted(out, key=lambda f: f.severity != "error")


def load_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is this a run folder?)")
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
    # A resumed run re-logs steps after its checkpoint: keep the latest value of each step.
    by_step = {}
    for i, r in enumerate(rows):
        by_step[r.get("step", i + 1)] = r
    return [by_step[s] for s in sorted(by_step)]


def load_config(run_dir: str | Path) -> dict:
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return {}
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def diagnose_run(run_dir: str | Path, *, correctness: str | None = None, thresholds: Thresholds | None = None) -> list[Finding]:
    ctx = Context(thresholds or Thresholds(), load_config(run_dir), correctness)
    return diagnose(load_metrics(run_dir), ctx)


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
