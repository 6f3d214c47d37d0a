"""Reading a run folder's files: the one reader for the doctor, the report, the console of a resumed run and
the run-folder rules of a resume (rlvr.training.run_folder).

| file | reader | what a damaged or missing file gives |
|---|---|---|
| `metrics.jsonl` | `read_metrics` | its complete lines, the last logged value of each step; no file: FileNotFoundError |
| `samples.jsonl` | `read_samples` | its complete lines; no file: [] |
| `summary.json` | `read_summary` | {} when missing or not JSON |
| `config.yaml` | `read_config` | {} when missing; keys that have moved, at their places now |

A line torn by a kill mid-write is skipped, never an error (`read_jsonl`).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from rlvr.config import ConfigError, upgrade


def read_jsonl(path: Path) -> list[dict]:
    """The complete lines of a JSON-lines log; a last line torn by a kill mid-write is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_metrics(run_dir: str | Path) -> list[dict]:
    """metrics.jsonl in step order. A resumed run re-logs the steps after its checkpoint: each step's last line counts."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is this a run folder?)")
    by_step = {}
    for i, row in enumerate(read_jsonl(path)):
        by_step[row.get("step", i + 1)] = row
    return [by_step[s] for s in sorted(by_step)]


def read_samples(run_dir: str | Path) -> list[dict]:
    """The logged completions (samples.jsonl), in the order written."""
    return read_jsonl(Path(run_dir) / "samples.jsonl")


def read_summary(run_dir: str | Path) -> dict:
    """summary.json, written when the run ended; {} while it runs (or when the file is damaged)."""
    path = Path(run_dir) / "summary.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        return {}


def read_config(run_dir: str | Path) -> dict:
    """The run's config.yaml as a plain dict ({} when there is none), keys that have moved since it was written at
    their places now (rlvr.config.renamed: the doctor's advice quotes `logging.doctor_every` for any run)."""
    path = Path(run_dir) / "config.yaml"
    saved = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
    try:
        return upgrade(saved)
    except ConfigError:  # an old key and its new one disagree (a hand-edited file): as written
        return saved
