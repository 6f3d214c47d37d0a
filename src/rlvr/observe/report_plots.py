"""The report's plots: one PNG per figure, several runs overlaid with one colour per run, long
curves smoothed over a faint raw line. Needs matplotlib (imported when a Plotter is made)."""

from __future__ import annotations

import math
from pathlib import Path

from rlvr.observe.report_data import Run, held_out_label


def _smooth(values: list[float], k: int) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        window = [x for x in acc[-k:] if math.isfinite(x)]
        out.append(sum(window) / len(window) if window else math.nan)
    return out


class Plotter:
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
        a.set_title("reward: mean ± std over the batch")
        b.set_title("mean of each reward function")
        for ax in (a, b):
            ax.set_xlabel("step")
        self.save(
            fig, "reward", "Reward", "Weighted total reward per step (band: ± its std over the batch), and each reward function's mean."
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

    def pass_at_k(self):
        """eval/pass@k (each k), maj@n and avg@n over the steps they were measured (eval.samples > 1, eval.every)."""
        keys = sorted({k for r in self.runs for m in r.metrics for k in m if k.startswith(("eval/pass@", "eval/maj@", "eval/avg@"))})
        if not keys:
            return
        fig, (ax,) = self.figure()
        styles = {"pass": "-o", "maj": "--s", "avg": ":^"}
        for r in self.runs:
            for key in keys:
                if r.has(key):
                    steps, values = r.series(key)
                    name = key.removeprefix("eval/")
                    ax.plot(steps, values, styles[name.split("@")[0]], label=self.label(r, name), markersize=3)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title("held-out pass@k, maj@n, avg@n (sampled: eval.samples)")
        self.save(
            fig, "pass_at_k", "Held-out pass@k",
            "Sampled held-out evaluation (eval.samples episodes per row at eval.temperature): pass@k, the unbiased estimator "
            "of Chen et al. 2021, for k = 1, 2, 4, ...; maj@n, the majority answer's accuracy; avg@n, the mean of all samples.",
        )  # fmt: skip

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
            "Share of tokens whose ratio hit the clip. Always 0 with algo.num_iterations=1; "
            "persistently high means the learning rate is too high.",
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
        controlled = [r for r in self.runs if r.series("entropy_coef")[0]]  # algo.adaptive_entropy
        fig, axes = self.figure(2 if controlled else 1)
        for r in self.runs:
            self.line(axes[0], r, "entropy", self.label(r))
        axes[0].set_title("mean token entropy (nats)")
        caption = "Mean entropy of the sampling distribution over completion tokens; a collapse to ~0 means no exploration left."
        if controlled:
            for r in controlled:
                self.line(axes[1], r, "entropy_coef", self.label(r), smooth=False)
            axes[1].set_title("adaptive entropy coefficient")
            caption += " Right: the coefficient algo.adaptive_entropy moved (it acts while entropy is at or below algo.entropy_target)."
        for ax in axes:
            ax.set_xlabel("step")
        self.save(fig, "entropy", "Entropy", caption)

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


def _score(v, what: str) -> str:
    return f"{v:.1%}" if what == "accuracy" else f"{v:.3f}"


def draw_plots(runs: list[Run], out_dir: Path) -> list[tuple[str, str, Path]]:
    """Every plot that has data, as PNGs in out_dir: (title, caption, png) in page order."""
    p = Plotter(runs, out_dir)
    for plot in (p.reward, p.accuracy, p.pass_at_k, p.zero_std, p.clip, p.kl, p.entropy, p.length, p.optim, p.timing):
        plot()
    return p.images
