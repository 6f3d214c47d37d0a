"""Where a run's metrics and completions go besides the console.

Always: `metrics.jsonl` (one JSON object per step) and the completions table `samples.jsonl`
(step, prompt, completion, reward/<fn>, advantage; one row per logged completion), mirrored to
`samples.parquet` when pyarrow is installed. Selected by `logging.report_to` when their package is
installed: TensorBoard (`tb/` in the run folder; `pip install 'rlvr[tensorboard]'`),
Weights & Biases (`wandb`) and trackio. Each sink is small: `log(metrics)`, `samples(rows)`,
`close()`; a sink whose backend fails is dropped with a note, never the run.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

BACKENDS = ("tensorboard", "wandb", "trackio")


def jsonable(v):
    """NaN -> null and +-inf -> "inf"/"-inf": strict JSON that `rlvr doctor` reads back as floats."""
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _numeric(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


def prompt_text(prompt) -> str:
    """A prompt as one string: plain text as is, chat messages as `role: content` lines."""
    if isinstance(prompt, list):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" if isinstance(m, dict) else str(m) for m in prompt)
    return str(prompt)


class Sink(Protocol):
    def log(self, metrics: dict) -> None: ...

    def samples(self, rows: list[dict]) -> None: ...

    def close(self) -> None: ...


class MetricsJsonl:
    def __init__(self, run_dir: Path):
        self.file = (run_dir / "metrics.jsonl").open("a", encoding="utf-8")

    def log(self, metrics: dict) -> None:
        self.file.write(json.dumps({k: jsonable(v) for k, v in metrics.items()}) + "\n")
        self.file.flush()

    def samples(self, rows: list[dict]) -> None:
        pass

    def close(self) -> None:
        self.file.close()


class CompletionsTable:
    """samples.jsonl (appended) and samples.parquet (rewritten whole at each logging step, via a
    temporary file, so it is always a complete, readable file even if the run dies)."""

    def __init__(self, run_dir: Path, parquet: bool = True):
        self.jsonl_path = run_dir / "samples.jsonl"
        self.parquet_path = run_dir / "samples.parquet"
        self.parquet = parquet and importlib.util.find_spec("pyarrow") is not None
        self.rows: list[dict] = []
        if self.parquet and self.jsonl_path.is_file():  # a resumed run: keep the earlier rows
            for line in self.jsonl_path.read_text(encoding="utf-8").splitlines():
                try:
                    self.rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        self.file = self.jsonl_path.open("a", encoding="utf-8")

    def log(self, metrics: dict) -> None:
        pass

    def samples(self, rows: list[dict]) -> None:
        for r in rows:
            self.file.write(json.dumps({k: jsonable(v) for k, v in r.items()}, default=str) + "\n")
        self.file.flush()
        if self.parquet and rows:
            self.rows += rows
            self._write_parquet()

    def _write_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        keys: list[str] = []
        for r in self.rows:
            keys += [k for k in r if k not in keys]
        cols = {}
        for k in keys:
            values = [r.get(k) for r in self.rows]
            if k == "prompt":
                values = [v if isinstance(v, str) or v is None else json.dumps(v) for v in values]
            elif k.startswith("reward") or k == "advantage":
                values = [None if v is None or not math.isfinite(float(v)) else float(v) for v in values]
            cols[k] = _arrow_column(pa, values)
        tmp = self.parquet_path.with_suffix(".parquet.tmp")
        pq.write_table(pa.table(cols), tmp)
        os.replace(tmp, self.parquet_path)

    def close(self) -> None:
        self.file.close()


def _arrow_column(pa, values: list):
    """The column as Arrow infers it, or as JSON text when its values have no common type (e.g. a logged column
    holding a dict in one row and a string in another)."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        return pa.array([v if v is None or isinstance(v, str) else json.dumps(jsonable(v), default=str) for v in values])


class TensorBoard:
    """Events in RUN_DIR/tb; the writer (and its file) starts at the first step, so a run that
    fails before training leaves nothing behind. A run resumed from step k purges the earlier
    segment's events after step k (they are done again), so no step appears twice."""

    def __init__(self, run_dir: Path, start_step: int = 0):
        from torch.utils.tensorboard import SummaryWriter

        purge = {"purge_step": start_step + 1} if start_step > 0 else {}
        self._open = lambda: SummaryWriter(log_dir=str(run_dir / "tb"), **purge)
        self._writer: SummaryWriter | None = None

    @property
    def writer(self):
        if self._writer is None:
            self._writer = self._open()
        return self._writer

    def log(self, metrics: dict) -> None:
        step = int(metrics.get("step", 0))
        for k, v in _numeric(metrics).items():
            if math.isfinite(v):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def samples(self, rows: list[dict]) -> None:
        if not rows:
            return
        keys = [k for k in rows[0] if k != "step"]
        cell = lambda v: str(v if not isinstance(v, float) else f"{v:.3f}").replace("|", "\\|").replace("\n", " ")  # noqa: E731
        lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        for r in rows:
            lines.append("| " + " | ".join(cell(prompt_text(r[k]) if k == "prompt" else r.get(k)) for k in keys) + " |")
        self.writer.add_text("completions", "\n".join(lines), int(rows[0].get("step", 0)))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class _WandbLike:
    """W&B and trackio share one API: init(project, name, config), log(dict, step), Table, finish."""

    module_name = "wandb"

    def __init__(self, run_dir: Path, config: dict):
        self.mod = __import__(self.module_name)
        project = os.environ.get(f"{self.module_name.upper()}_PROJECT", "rlvr")
        kwargs = {"project": project, "name": run_dir.name, "config": config}
        if self.module_name == "wandb":
            kwargs["dir"] = str(run_dir)
        self.run = self.mod.init(**kwargs)

    def log(self, metrics: dict) -> None:
        data = {k: v for k, v in _numeric(metrics).items() if math.isfinite(v)}
        self.mod.log(data, step=int(metrics.get("step", 0)))

    def samples(self, rows: list[dict]) -> None:
        if not rows or not hasattr(self.mod, "Table"):
            return
        keys = list(rows[0])
        data = [[prompt_text(r.get(k)) if k == "prompt" else r.get(k) for k in keys] for r in rows]
        self.mod.log({"completions": self.mod.Table(columns=keys, data=data)}, step=int(rows[0].get("step", 0)))

    def close(self) -> None:
        self.mod.finish()


class Wandb(_WandbLike):
    module_name = "wandb"


class Trackio(_WandbLike):
    module_name = "trackio"


def make_sinks(run_dir: Path, report_to: list[str], config: dict | None = None, start_step: int = 0) -> tuple[list[Sink], list[str]]:
    """The sinks for a run (resumed after step `start_step`) and notes about selected backends that are not available.

    TensorBoard is skipped silently when its package is missing (it is on by default);
    a missing wandb or trackio that was asked for gets a note."""
    sinks: list[Sink] = [MetricsJsonl(run_dir), CompletionsTable(run_dir)]
    notes: list[str] = []
    factory: Callable[[], Sink]
    for name in report_to:
        if name == "none":
            continue
        if name == "tensorboard":
            if importlib.util.find_spec("tensorboard") is None:
                continue
            factory = lambda: TensorBoard(run_dir, start_step)  # noqa: E731
        elif name in ("wandb", "trackio"):
            if importlib.util.find_spec(name) is None:
                notes.append(f"report_to has {name!r} but the {name} package is not installed (pip install {name}): not logging there")
                continue
            factory = functools.partial(Wandb if name == "wandb" else Trackio, run_dir, config or {})
        else:
            notes.append(f"report_to: unknown backend {name!r} (choose from {', '.join(BACKENDS)}, none)")
            continue
        try:
            sinks.append(factory())
        except Exception as e:  # a dashboard must never take the run down
            notes.append(f"report_to {name!r} could not start ({type(e).__name__}: {e}): not logging there")
    return sinks, notes
