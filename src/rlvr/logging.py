"""Metric sinks: metrics.jsonl (always), sample completions, and the console.

The console shows a live progress bar when stdout is a terminal and one plain line per step
otherwise (CI, files, pipes).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


class RunLogger:
    def __init__(self, output_dir: Path, total_steps: int, start_step: int = 0, *, live: bool | None = None):
        self.dir = output_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_file = (self.dir / "metrics.jsonl").open("a", encoding="utf-8")
        self.samples_file = (self.dir / "samples.jsonl").open("a", encoding="utf-8")
        self.console = Console(stderr=False)
        self.live = sys.stdout.isatty() if live is None else live
        self.total = total_steps
        self.t0 = time.time()
        self.progress = None
        if self.live:
            self.progress = Progress(
                TextColumn("[bold]step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.task = self.progress.add_task("train", total=total_steps, completed=start_step, info="")
            self.progress.start()

    def info(self, msg: str) -> None:
        if self.progress is not None:
            self.progress.console.print(msg)
        else:
            print(msg, flush=True)

    def log(self, metrics: dict) -> None:
        self.metrics_file.write(json.dumps({k: _jsonable(v) for k, v in metrics.items()}) + "\n")
        self.metrics_file.flush()
        step = metrics["step"]
        summary = f"reward {metrics['reward']:.3f}  loss {metrics['loss']:+.4f}  len {metrics['completions/mean_length']:.1f}"
        if "kl" in metrics:
            summary += f"  kl {metrics['kl']:.4f}"
        if self.progress is not None:
            self.progress.update(self.task, completed=step, info=summary)
        else:
            rate = (time.time() - self.t0) / max(step, 1)
            print(f"step {step}/{self.total}  {summary}  clip {metrics['clip_ratio/region_mean']:.3f}  {metrics['time/step']:.2f}s/step", flush=True)

    def samples(self, rows: list[dict]) -> None:
        for r in rows:
            self.samples_file.write(json.dumps(r, default=str) + "\n")
        self.samples_file.flush()

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
        self.metrics_file.close()
        self.samples_file.close()
