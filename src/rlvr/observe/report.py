"""`rlvr report RUN_DIR [RUN_DIR2 ...]`: one self-contained `report.html` plus PNGs.

Plots (several runs overlaid, one colour per run): reward mean ± std and each reward function,
held-out accuracy (or a reward's mean) before/after and every eval.every steps, frac_reward_zero_std, clip ratios, KL (when a
penalty was on), entropy, completion length (mean, max, truncated share), learning rate and
gradient norm, and time per step split into generate / reward / train. Below them: the doctor's
findings and the best and worst completions of the last logged steps. Images are embedded as
base64, the page loads nothing from anywhere (no scripts, no fonts, no network).

Needs matplotlib: `pip install 'rlvr[report]'`.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.observe.doctor import Context, Finding, diagnose, num
from rlvr.observe.run_files import read_config, read_metrics, read_samples, read_summary
from rlvr.observe.sinks import prompt_text


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


def _unique_names(runs: list[Run]) -> None:
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


# ------------------------------------------------------------------------------------------ plots


def _smooth(values: list[float], k: int) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        window = [x for x in acc[-k:] if math.isfinite(x)]
        out.append(sum(window) / len(window) if window else math.nan)
    return out


class _Plotter:
    def __init__(self, runs: list[Run], out_dir: Path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt = plt
        self.runs = runs
        self.out = out_dir
        cmap = plt.get_cmap("tab10")
        self.colors = {r.name: cmap(i % 10) for i, r in enumerate(runs)}
        self.images: list[tuple[str, str, Path]] = []  # (title, caption, png)

    def line(self, ax, run: Run, key: str, label: str | None = None, style: str = "-", smooth: bool = True, color=None):
        steps, values = run.series(key)
        if not steps:
            return False
        color = color or self.colors[run.name]
        if smooth and len(values) >= 20:
            ax.plot(steps, values, style, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(steps, _smooth(values, max(3, len(values) // 20)), style, color=color, linewidth=1.8, label=label)
        else:
            ax.plot(steps, values, style, color=color, linewidth=1.5, label=label, marker="o" if len(values) < 3 else None)
        return True

    def save(self, fig, name: str, title: str, caption: str) -> None:
        for ax in fig.axes:
            ax.grid(True, alpha=0.3)
            handles, labels = ax.get_legend_handles_labels()
            if labels:
                ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        path = self.out / f"{name}.png"
        fig.savefig(path, dpi=100)
        self.plt.close(fig)
        self.images.append((title, caption, path))

    def figure(self, ncols: int = 1):
        fig, axes = self.plt.subplots(1, ncols, figsize=(6.4 * ncols, 3.8), squeeze=False)
        return fig, list(axes[0])

    def multi(self) -> bool:
        return len(self.runs) > 1

    def label(self, run: Run, what: str | None = None) -> str:
        if what is None:
            return run.name
        return f"{run.name}: {what}" if self.multi() else what

    # -------------------------------------------------------------------------------- the plots

    def reward(self):
        fig, (a, b) = self.figure(2)
        for r in self.runs:
            steps, mean = r.series("reward")
            _, std = r.series("reward_std")
            if len(std) == len(mean):
                if len(mean) >= 20:  # the band follows the smoothed line
                    k = max(3, len(mean) // 20)
                    mean, std = _smooth(mean, k), _smooth(std, k)
                lo = [m - s for m, s in zip(mean, std)]
                hi = [m + s for m, s in zip(mean, std)]
                a.fill_between(steps, lo, hi, color=self.colors[r.name], alpha=0.15, linewidth=0)
            self.line(a, r, "reward", self.label(r))
            styles = ["-", "--", ":", "-."]
            for i, n in enumerate(r.reward_names):
                self.line(b, r, f"rewards/{n}/mean", self.label(r, n), styles[i % 4])
        a.set_title("reward: mean ± mean within-group std")
        b.set_title("mean of each reward function")
        for ax in (a, b):
            ax.set_xlabel("step")
        self.save(
            fig, "reward", "Reward", "Weighted total reward per step (band: ± the mean within-group std), and each reward function's mean."
        )

    def accuracy(self):
        evaluated = [r for r in self.runs if "eval_before" in r.summary or "eval_after" in r.summary]
        during = [r for r in self.runs if r.has("eval/reward")]
        if not evaluated and not during:
            return
        what = held_out_label(self.runs)
        fig, axes = self.figure(2 if evaluated and during else 1)
        if evaluated:
            ax = axes[0]
            width = 0.8 / len(evaluated)
            for i, r in enumerate(evaluated):
                vals = [r.summary.get("eval_before", math.nan), r.summary.get("eval_after", math.nan)]
                xs = [x + i * width for x in (0, 1)]
                bars = ax.bar(
                    xs, [0 if v is None or not math.isfinite(v) else v for v in vals], width, color=self.colors[r.name], label=r.name
                )
                for bar, v in zip(bars, vals):
                    if v is not None and math.isfinite(v):
                        ax.annotate(
                            _score(v, what), (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8
                        )
            center = (len(evaluated) - 1) * width / 2
            ax.set_xticks([center, 1 + center], ["before training", "after training"])
            ax.set_ylabel(f"held-out {what} (greedy)")
            ax.set_ylim(
                0,
                max(0.05, max(v for r in evaluated for v in (r.summary.get("eval_before") or 0, r.summary.get("eval_after") or 0)) * 1.25),
            )
            ax.set_title(f"held-out {what}")
        if during:
            ax = axes[-1]
            for r in during:
                steps, values = r.series("eval/reward")
                if "eval_before" in r.summary:  # step 0 and the last step are the before/after numbers
                    steps, values = [0, *steps], [r.summary["eval_before"], *values]
                if "eval_after" in r.summary and r.metrics:
                    steps, values = [*steps, int(r.metrics[-1].get("step", len(r.metrics)))], [*values, r.summary["eval_after"]]
                ax.plot(steps, values, "-o", color=self.colors[r.name], label=r.name, markersize=3)
            ax.set_xlabel("step")
            ax.set_title(f"held-out {what} during training (eval.every)")
        self.save(
            fig,
            "accuracy",
            f"Held-out {what}",
            f"Greedy {what} on the held-out set ({', '.join(sorted({str(r.summary.get('eval_set', '?')) for r in self.runs}))}), "
            "before and after training" + (", and every eval.every steps." if during else "."),
        )

    def zero_std(self):
        fig, (ax,) = self.figure()
        for r in self.runs:
            self.line(ax, r, "frac_reward_zero_std", self.label(r))
        ax.set_ylim(-0.02, 1.02)
        ax.set_title("frac_reward_zero_std (groups with identical rewards: no signal)")
        ax.set_xlabel("step")
        self.save(
            fig,
            "zero_std",
            "Zero-signal groups",
            "Share of groups whose rewards were all equal: their advantages are 0 and they teach nothing.",
        )

    def clip(self):
        fig, (ax,) = self.figure()
        for r in self.runs:
            self.line(ax, r, "clip_ratio/region_mean", self.label(r, "region"), "-")
            self.line(ax, r, "clip_ratio/low_mean", self.label(r, "low"), "--")
            self.line(ax, r, "clip_ratio/high_mean", self.label(r, "high"), ":")
        ax.set_title("clip ratios (share of tokens clipped)")
        ax.set_xlabel("step")
        self.save(
            fig,
            "clip",
            "Clip ratios",
            "Share of tokens whose ratio hit the clip. Always 0 with algo.num_iterations=1; persistently high means the learning rate is too high.",
        )

    def kl(self):
        runs = [r for r in self.runs if r.has("kl")]
        if not runs:
            return
        fig, (ax,) = self.figure()
        for r in runs:
            self.line(ax, r, "kl", self.label(r))
        ax.set_title("KL to the reference model (per token)")
        ax.set_xlabel("step")
        self.save(fig, "kl", "KL", "Only runs with a KL penalty (algo.beta > 0) have a reference model and this curve.")

    def entropy(self):
        fig, (ax,) = self.figure()
        for r in self.runs:
            self.line(ax, r, "entropy", self.label(r))
        ax.set_title("mean token entropy (nats)")
        ax.set_xlabel("step")
        self.save(
            fig,
            "entropy",
            "Entropy",
            "Mean entropy of the sampling distribution over completion tokens; a collapse to ~0 means no exploration left.",
        )

    def length(self):
        fig, (a, b) = self.figure(2)
        for r in self.runs:
            self.line(a, r, "completions/mean_length", self.label(r, "mean"), "-")
            self.line(a, r, "completions/max_length", self.label(r, "max"), "--", smooth=False)
            self.line(b, r, "completions/clipped_ratio", self.label(r))
        a.set_title("completion length (tokens)")
        b.set_title("truncated share (hit max_new_tokens)")
        b.set_ylim(-0.02, 1.02)
        for ax in (a, b):
            ax.set_xlabel("step")
        self.save(
            fig,
            "length",
            "Completion length",
            "Mean and max completion length, and the share of completions cut off at rollout.max_new_tokens.",
        )

    def optim(self):
        fig, (a, b) = self.figure(2)
        for r in self.runs:
            self.line(a, r, "learning_rate", self.label(r), smooth=False)
            self.line(b, r, "grad_norm", self.label(r))
        a.set_title("learning rate")
        b.set_title("gradient norm (before clipping)")
        a.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        for ax in (a, b):
            ax.set_xlabel("step")
        self.save(
            fig, "optim", "Learning rate and gradient norm", "The schedule's learning rate and the global gradient norm before clipping."
        )

    def timing(self):
        fig, axes = self.figure(len(self.runs))
        parts = [("time/generate", "generate"), ("time/reward", "reward"), ("time/train", "train")]
        for ax, r in zip(axes, self.runs):
            steps, _ = r.series("time/step")
            stacks = []
            for key, _ in parts:
                s, v = r.series(key)
                by_step = dict(zip(s, v))
                stacks.append([by_step.get(x, 0.0) if math.isfinite(by_step.get(x, 0.0)) else 0.0 for x in steps])
            if steps:
                ax.stackplot(steps, *stacks, labels=[label for _, label in parts], alpha=0.8)
            ax.set_title(f"time per step (s){': ' + r.name if self.multi() else ''}")
            ax.set_xlabel("step")
        self.save(fig, "time", "Time per step", "Seconds per step split into generation, reward functions and the update.")


# ------------------------------------------------------------------------------------- html parts


def _best_worst(run: Run, last_steps: int = 3, k: int = 5) -> tuple[list[dict], list[dict]]:
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


_SAMPLE_KEYS = {"step", "prompt", "completion", "conversation", "advantage", "_total"}


def _completion_table(rows: list[dict]) -> str:
    if not rows:
        return "<p class=dim>none logged</p>"
    reward_keys, logged_keys = [], []  # logged: the columns reward functions added (TRL's log_extra)
    for r in rows:
        reward_keys += [k for k in r if k.startswith("reward/") and k not in reward_keys]
        logged_keys += [k for k in r if not k.startswith("reward/") and k not in _SAMPLE_KEYS and k not in logged_keys]
    head = "".join(f"<th>{html.escape(k[7:])}</th>" for k in reward_keys) + "".join(f"<th>{html.escape(k)}</th>" for k in logged_keys)
    out = [f"<table><tr><th>step</th><th>prompt</th><th>completion</th><th>total</th>{head}<th>advantage</th></tr>"]
    for r in rows:
        cells = "".join(f"<td class=num>{_num(r.get(k))}</td>" for k in reward_keys)
        cells += "".join(f"<td>{html.escape(str(r.get(k, '')))}</td>" for k in logged_keys)
        out.append(
            f"<tr><td class=num>{r.get('step', '')}</td><td><pre>{html.escape(prompt_text(r.get('prompt', '')))}</pre></td>"
            f"<td>{_episode_html(r)}</td><td class=num>{_num(r.get('_total'))}</td>{cells}"
            f"<td class=num>{_num(r.get('advantage'), '+.3f')}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _episode_html(row: dict) -> str:
    """A completion; a multi-turn episode as its conversation, tool calls and results marked."""
    conv = row.get("conversation")
    if not isinstance(conv, list):
        return f"<pre>{html.escape(str(row.get('completion', '')))}</pre>"
    parts = []
    for m in conv:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", ""))
        text = str(m.get("content") or "")
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else {}
            text += f"\n[tool call] {fn.get('name', '?')}({json.dumps(fn.get('arguments', {}), ensure_ascii=False)})"
        label = f"tool result ({m.get('name', '?')})" if role == "tool" else role
        cls = "tool" if role == "tool" else "turn"
        parts.append(f"<div class={cls}><span class=dim>{html.escape(label)}</span><pre>{html.escape(text)}</pre></div>")
    return "".join(parts)


def _num(v, spec: str = ".3f") -> str:
    x = num(v)
    return format(x, spec) if math.isfinite(x) else html.escape(str(v))


def _runs_table(runs: list[Run]) -> str:
    def get(cfg, dotted, default="-"):
        node = cfg
        for p in dotted.split("."):
            if not isinstance(node, dict) or p not in node:
                return default
            node = node[p]
        return node

    out = [
        "<table><tr><th>run</th><th>steps</th><th>model</th><th>loss</th><th>G</th><th>lr</th><th>beta</th>"
        f"<th>first → last reward</th><th>held-out {held_out_label(runs)}</th><th>train time</th></tr>"
    ]
    for r in runs:
        _, rewards = r.series("reward")
        first = sum(rewards[:5]) / max(1, len(rewards[:5])) if rewards else math.nan
        last = sum(rewards[-5:]) / max(1, len(rewards[-5:])) if rewards else math.nan
        acc = "-"
        if "eval_before" in r.summary or "eval_after" in r.summary:
            b, a = r.summary.get("eval_before"), r.summary.get("eval_after")
            fmt = _pct if r.summary.get("eval_label", "accuracy") == "accuracy" else _num
            acc = f"{fmt(b)} → {fmt(a)}"
        t = r.summary.get("train_seconds")
        c = r.config
        out.append(
            f"<tr><td><b>{html.escape(r.name)}</b><br><span class=dim>{html.escape(str(r.dir))}</span></td>"
            f"<td class=num>{len(r.metrics)}</td><td>{html.escape(str(get(c, 'model.path')))}</td>"
            f"<td>{html.escape(str(get(c, 'algo.loss_type')))}</td><td class=num>{get(c, 'rollout.group_size')}</td>"
            f"<td class=num>{get(c, 'optim.lr')}</td><td class=num>{get(c, 'algo.beta')}</td>"
            f"<td class=num>{_num(first)} → {_num(last)}</td><td class=num>{acc}</td>"
            f"<td class=num>{'-' if t is None else f'{t:.0f}s'}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _reward_errors_table(runs: list[Run]) -> str:
    """Per run and reward function: failed samples in all, steps with failures, the worst step's failure rate."""
    rows = []
    for r in runs:
        for name in r.reward_names:
            steps, errors = r.series(f"rewards/{name}/errors")
            _, rates = r.series(f"rewards/{name}/error_rate")
            total = sum(e for e in errors if math.isfinite(e))
            if total:
                failing = sum(1 for e in errors if e > 0)
                rows.append(
                    f"<tr><td>{html.escape(r.name)}</td><td>{html.escape(name)}</td><td class=num>{total:.0f}</td>"
                    f"<td class=num>{failing} of {len(steps)}</td><td class=num>{_pct(max(rates) if rates else math.nan)}</td></tr>"
                )
    if not rows:
        return "<p class=ok>No reward function failed.</p>"
    return (
        "<table><tr><th>run</th><th>reward</th><th>failed samples</th><th>steps with failures</th><th>worst step</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _png_width(png: Path) -> int:
    """Pixel width from the PNG header (IHDR), so captions wrap at the image's width."""
    return int.from_bytes(png.read_bytes()[16:20], "big")


def held_out_label(runs: list[Run]) -> str:
    """`accuracy` when every evaluated run scored a task's 0/1 verifier, else `score` (the mean of a reward)."""
    labels = {r.summary.get("eval_label", "accuracy") for r in runs if "eval_after" in r.summary or "eval_before" in r.summary}
    return "accuracy" if labels <= {"accuracy"} else "score"


def _score(v, what: str) -> str:
    return f"{v:.1%}" if what == "accuracy" else f"{v:.3f}"


def _pct(v) -> str:
    return "-" if v is None or not math.isfinite(float(v)) else f"{float(v):.1%}"


def _findings_html(findings: list[Finding]) -> str:
    if not findings:
        return "<p class=ok>No problems found.</p>"
    items = []
    for f in findings:
        items.append(
            f"<li class={f.severity}><b>{html.escape(f.rule)}</b> <code>{html.escape(f.metric)}</code>: {html.escape(f.message)}"
            f"<br><span class=dim>evidence:</span> {html.escape(f.evidence)}<br><span class=dim>fix:</span> {html.escape(f.fix)}</li>"
        )
    return "<ul>" + "".join(items) + "</ul>"


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1320px;padding:0 1em;color:#222}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em} td,th{border:1px solid #ddd;padding:.3em .5em;vertical-align:top;text-align:left}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
pre{margin:0;white-space:pre-wrap;word-break:break-word;max-width:36em;font-size:.95em}
.dim{color:#777;font-size:.9em} .ok{color:#1a7f37} li.warning{color:#8a5a00} li.error{color:#b42318} li{margin-bottom:.6em}
.plots{display:flex;flex-wrap:wrap;gap:0 1.5em;align-items:flex-start}
figure{margin:1em 0;max-width:100%} figure h3{margin:.2em 0} figure img{max-width:100%;border:1px solid #eee} figcaption{color:#555;font-size:.9em}
div.turn,div.tool{padding:.15em .4em;margin:.1em 0;border-left:3px solid #9bb7d4} div.tool{border-left-color:#d4a72c;background:#fffbeb}
"""


def make_report(run_dirs: list[str | Path], out_dir: str | Path | None = None, *, title: str | None = None) -> Path:
    """Write report.html and the PNGs to out_dir (default: RUN_DIR/report for one run,
    ./rlvr-report for several); returns the path of report.html."""
    runs = [load_run(d) for d in run_dirs]
    if not runs:
        raise ValueError("rlvr report: give at least one run folder")
    _unique_names(runs)
    out = Path(out_dir) if out_dir else (runs[0].dir / "report" if len(runs) == 1 else Path("rlvr-report"))
    out.mkdir(parents=True, exist_ok=True)
    p = _Plotter(runs, out)
    for plot in (p.reward, p.accuracy, p.zero_std, p.clip, p.kl, p.entropy, p.length, p.optim, p.timing):
        plot()

    title = title or ("rlvr report: " + ", ".join(r.name for r in runs))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<h2>Runs</h2>",
        _runs_table(runs),
        "<h2>Reward errors</h2>",
        _reward_errors_table(runs),
        "<h2>Doctor</h2>",
    ]
    for r in runs:
        findings = diagnose(r.metrics, Context(config=r.config))
        if len(runs) > 1:
            parts.append(f"<h3>{html.escape(r.name)}</h3>")
        parts.append(_findings_html(findings))
    parts.append('<h2>Plots</h2><div class="plots">')
    for t, caption, png in p.images:
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        parts.append(
            f'<figure id="{png.stem}"><h3>{html.escape(t)}</h3><img alt="{html.escape(t)}" src="data:image/png;base64,{data}">'
            f'<figcaption style="max-width:{_png_width(png)}px">{html.escape(caption)}</figcaption></figure>'
        )
    parts.append("</div>")
    parts.append("<h2>Completions of the last logged steps</h2>")
    for r in runs:
        best, worst = _best_worst(r)
        if len(runs) > 1:
            parts.append(f"<h3>{html.escape(r.name)}</h3>")
        parts.append("<h4>best</h4>" + _completion_table(best))
        parts.append("<h4>worst</h4>" + _completion_table(worst))
    parts.append("</body></html>")
    path = out / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
