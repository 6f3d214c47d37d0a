"""The report's data: runs read from their folders (metric series, summary, config, samples), unique
names for runs overlaid on one plot, the best and worst completions of the last logged steps, and
whether the held-out number is an accuracy or a score."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.observe.doctor import num
from rlvr.observe.run_files import read_config, read_metrics, read_samples, read_summary


@dataclass
class Run:
    dir: Path
    name: str
    metrics: list[dict]
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        steps, values = [], []
        for i, m in enumerate(self.metrics):
            if key in m:
                steps.append(int(m.get("step", i + 1)))
                values.append(num(m[key]))
        return steps, values

    def has(self, key: str) -> bool:
        return any(key in m for m in self.metrics)

    @property
    def reward_names(self) -> list[str]:
        names: list[str] = []
        for m in self.metrics:
            for k in m:
                if k.startswith("rewards/") and k.endswith("/mean") and k[8:-5] not in names:
                    names.append(k[8:-5])
        return names


def load_run(run_dir: str | Path, name: str | None = None) -> Run:
    d = Path(run_dir)
    return Run(d, name or d.resolve().name, read_metrics(d), read_summary(d), read_config(d), read_samples(d))


def unique_names(runs: list[Run]) -> None:
    """Runs named alike (every run folder called `run`, say) get their parent folder's name too."""
    names = [r.name for r in runs]
    for r in runs:
        if names.count(r.name) > 1:
            r.name = f"{r.dir.resolve().parent.name}/{r.dir.resolve().name}"
    seen: dict[str, int] = {}
    for r in runs:
        seen[r.name] = seen.get(r.name, 0) + 1
        if seen[r.name] > 1:
            r.name = f"{r.name} ({seen[r.name]})"


def best_worst(run: Run, last_steps: int = 3, k: int = 5) -> tuple[list[dict], list[dict]]:
    """Best and worst completions of the last `last_steps` logged steps, by weighted total reward
    (weights from the run's config.yaml, in reward order), ties broken by advantage."""
    if not run.samples:
        return [], []
    steps = sorted({s.get("step", 0) for s in run.samples})[-last_steps:]
    rows = [s for s in run.samples if s.get("step", 0) in steps]
    weights = [float(r.get("weight", 1.0)) if isinstance(r, dict) else 1.0 for r in run.config.get("rewards", [])]

    def total(row):
        vals = [num(row[k]) for k in row if k.startswith("reward/")]
        ws = weights if len(weights) == len(vals) else [1.0] * len(vals)
        return sum(w * v for w, v in zip(ws, vals) if math.isfinite(v))

    for r in rows:
        r["_total"] = total(r)
    ranked = sorted(rows, key=lambda r: (r["_total"], num(r.get("advantage", 0))), reverse=True)
    best = ranked[:k]
    worst = [r for r in ranked[::-1] if r not in best][:k]
    return best, worst


def held_out_label(runs: list[Run]) -> str:
    """`accuracy` when every evaluated run scored a task's 0/1 verifier, else `score` (the mean of a reward)."""
    labels = {r.summary.get("eval_label", "accuracy") for r in runs if "eval_after" in r.summary or "eval_before" in r.summary}
    return "accuracy" if labels <= {"accuracy"} else "score"
