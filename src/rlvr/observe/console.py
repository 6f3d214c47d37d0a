"""What a run shows while it trains: the console, the metric sinks, and the doctor's warnings.

The console shows a live rich display when stdout is a terminal or a Jupyter notebook (a progress bar with step/total,
elapsed time, ETA and steps/s, and below it reward ± std, each reward function, KL, clip ratio,
completion length, entropy and the share of zero-signal groups), and one plain line per step
otherwise (CI, files, pipes). Sinks (metrics.jsonl, the completions table, TensorBoard, W&B,
trackio) live in `rlvr.sinks`. The doctor's rules (`rlvr.doctor`) run on the history when the training
loop asks (after the first 3 steps and every `logging.doctor_every` steps, and at the end); new findings are printed as warnings.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from rich.columns import Columns
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from rlvr.config import Config, upgrade
from rlvr.observe.doctor import Context, LiveDoctor
from rlvr.observe.run_files import read_metrics
from rlvr.observe.sinks import make_sinks


def _fmt_time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"


def _f(v, spec: str = ".3f") -> str:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return "-"
    return format(v, spec) if math.isfinite(v) else str(v)


def stdout_is_live(console: Console | None = None) -> bool:
    """A live display on a real terminal (not TERM=dumb) and in Jupyter, never under CI (a notebook run by CI too).
    Rich draws it in a notebook through ipywidgets: without them it would draw nothing, so plain lines instead."""
    if os.environ.get("CI"):
        return False
    if (console or Console()).is_jupyter:
        return importlib.util.find_spec("ipywidgets") is not None
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


class NullLogger:
    """What ranks other than 0 log to: nothing (rank 0 writes the run's files and console)."""

    def info(self, msg: str) -> None: ...
    def warn(self, msg: str) -> None: ...
    def log(self, metrics: dict) -> None: ...
    def run_doctor_when_due(self, step: int) -> list:
        return []

    def samples(self, rows: list[dict]) -> None: ...
    def close(self) -> None: ...


class RunLogger:
    def __init__(
        self,
        output_dir: Path,
        total_steps: int,
        start_step: int = 0,
        *,
        live: bool | None = None,
        config: Config | Mapping[str, Any] | None = None,
        console: Console | None = None,
    ):
        """`config` (a Config or its dict) selects sinks (`logging.report_to`), the doctor's cadence
        (`logging.doctor_every`) and lets the doctor quote current settings in its advice. `console`: where the
        live display goes (default: stdout's; in Jupyter, the notebook); `live` None: stdout_is_live(console)."""
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else upgrade(dict(config or {}))
        lg = cfg.get("logging") or {}
        self.notes: list[str] = []
        report_to = lg.get("report_to", [])
        self.sinks, notes = make_sinks(self.dir, list(report_to or []), cfg, start_step)
        self.notes += notes
        self.doctor_every = int(lg.get("doctor_every", 10) or 0)
        self.doctor = LiveDoctor(Context(config=cfg))
        self.findings: list = []
        self.history: list[dict] = []
        if start_step > 0 and (self.dir / "metrics.jsonl").is_file():  # resumed: the rules see the whole run
            self.history = [m for m in read_metrics(self.dir) if m.get("step", 0) <= start_step]
        self.console = console or Console(stderr=False)
        self.is_live = stdout_is_live(self.console) if live is None else live
        self.total = total_steps
        self.start_step = start_step
        self.steps_done = 0
        self.last: dict = {}
        self.progress = None
        self._live = None
        if self.is_live:
            self.progress = Progress(
                TextColumn("[bold]step"),
                MofNCompleteColumn(),
                BarColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA {task.fields[eta]}  {task.fields[rate]}"),
                console=self.console,
                auto_refresh=False,
            )
            self.task = self.progress.add_task("train", total=total_steps, completed=start_step, eta="?", rate="")
            self._live = Live(get_renderable=self._render, console=self.console, refresh_per_second=4, transient=False)
            self._live.start()
        for n in notes:
            self.info(f"[note] {n}")

    # --------------------------------------------------------------------------- console output

    def _rate(self) -> tuple[float, float]:
        """(steps per second, seconds left), from the recent steps' own `time/step` so that
        evaluation or start-up time does not distort them."""
        times = [float(m["time/step"]) for m in self.history[-10:] if isinstance(m.get("time/step"), (int, float))]
        if not times or sum(times) <= 0:
            return math.nan, math.nan
        per_step = sum(times) / len(times)
        done = int(self.history[-1].get("step", self.start_step + self.steps_done)) if self.history else self.start_step
        return 1.0 / per_step, max(0, self.total - done) * per_step

    def summary_fields(self, m: dict) -> list[tuple[str, str]]:
        """(label, value) pairs shown for a step, in order; shared by the live table and plain lines."""
        out = [("reward", f"{_f(m.get('reward'))}±{_f(m.get('reward_std'))}")]
        for k, v in m.items():
            if k.startswith("rewards/") and k.endswith("/mean"):
                out.append((k[len("rewards/") : -len("/mean")], _f(v)))
        if "kl" in m:
            out.append(("kl", _f(m["kl"], ".4f")))
        out.append(("clip", _f(m.get("clip_ratio/region_mean"))))
        out.append(("len", f"{_f(m.get('completions/mean_length'), '.1f')}/{_f(m.get('completions/max_length'), '.0f')}"))
        if m.get("completions/clipped_ratio"):
            out.append(("truncated", _f(m["completions/clipped_ratio"], ".0%")))
        out.append(("entropy", _f(m.get("entropy"))))
        if "entropy_coef" in m:  # algo.adaptive_entropy: the coefficient it moved to
            out.append(("ent.coef", _f(m["entropy_coef"], ".4f")))
        out.append(("zero-std", _f(m.get("frac_reward_zero_std"), ".0%")))
        out.append(("loss", _f(m.get("loss"), "+.4f")))
        return out

    def _render(self):
        assert self.progress is not None, "the live display exists only with the progress bar"
        parts = [self.progress.get_renderable()]
        if self.last:
            # one `label value` item per field; a narrow terminal wraps between items, never inside
            items = [Text.assemble((label + " ", "dim"), (value, "bold")) for label, value in self.summary_fields(self.last)]
            parts.append(Columns(items, padding=(0, 3)))
        return Group(*parts)

    def info(self, msg: str) -> None:
        if self._live is not None:
            self.console.print(msg, markup=False, highlight=False)
        else:
            print(msg, flush=True)

    def warn(self, msg: str) -> None:
        if self._live is not None:
            self.console.print(Text(f"[warning] {msg}", style="yellow"))
        else:
            print(f"[warning] {msg}", flush=True)

    # --------------------------------------------------------------------------------- the step

    def log(self, metrics: dict) -> None:
        self._each_sink("log", metrics)
        self.history.append(metrics)
        self.last = metrics
        self.steps_done += 1
        step = int(metrics["step"])
        rate, left = self._rate()
        rate_s = f"{rate:.2f} steps/s" if math.isfinite(rate) else ""
        if self.progress is not None:
            self.progress.update(self.task, completed=step, eta=_fmt_time(left), rate=rate_s)
            assert self._live is not None, "started with the progress bar"
            self._live.refresh()
        else:
            fields = "  ".join(f"{label} {value}" for label, value in self.summary_fields(metrics))
            t = metrics.get("time/step")
            print(f"step {step}/{self.total}  {fields}  {_f(t, '.2f')}s/step  {rate_s}  ETA {_fmt_time(left)}", flush=True)

    def run_doctor_when_due(self, step: int) -> list:
        """The doctor's rules over the run so far, after the third step logged here and every `doctor_every` steps
        (the training loop calls it after logging each step); new findings are printed as warnings."""
        if self.steps_done == 3 or (self.doctor_every and step % self.doctor_every == 0):
            return self.run_doctor()
        return []

    def run_doctor(self) -> list:
        new = self.doctor.check(self.history)
        for f in new:
            self.warn(f"doctor: {f.message}\n    evidence: {f.evidence}\n    fix: {f.fix}")
        self.findings += new
        return new

    def samples(self, rows: list[dict]) -> None:
        self._each_sink("samples", rows)

    def _each_sink(self, method: str, arg) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(arg)
            except Exception as e:  # a dashboard must never take the run down
                if sink is self.sinks[0]:
                    raise  # metrics.jsonl is the record of the run: its failure is a real error
                self.sinks.remove(sink)
                self.info(f"[note] {type(sink).__name__} failed ({type(e).__name__}: {e}); no longer logging there")

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self.history and self.doctor_every:
            self.run_doctor()
            rules = sorted({f.rule for f in self.findings})
            if rules:
                self.info(f"doctor: {len(rules)} kind(s) of problem seen ({', '.join(rules)}); details: rlvr doctor {self.dir}")
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:
                pass
