"""Load prompt rows from JSONL / JSON / Parquet / CSV files or from `datasets` (hub id or folder).

Errors name the file and line, or the missing column with the columns that exist.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rlvr import live
from rlvr.hub import looks_like_hub_id, offline_reason


class DataError(ValueError):
    """A dataset problem; the message names the file, line or column."""


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: each line must be a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _read_json(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if isinstance(data, dict) and "data" in data:
        data = data["data"]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DataError(f"{path}: expected a list of objects (or {{'data': [...]}})")
    return data


def _read_parquet(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow: pip install 'rlvr[data]'") from None
    return pq.read_table(path).to_pylist()


def _read_csv(path: Path) -> list[dict]:
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet, ".csv": _read_csv}


def _read_datasets(source: str, split: str, subset: str | None, what: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{what}={source!r} is not a file; loading `datasets` needs: pip install 'rlvr[data]'") from None
    p = Path(source)
    if p.is_dir() and any((p / f).exists() for f in ("dataset_dict.json", "state.json")):
        ds = datasets.load_from_disk(str(p))  # written by save_to_disk
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"{p}: no split {split!r}; splits: {sorted(ds)}")
            ds = ds[split]
    elif not p.exists() and looks_like_hub_id(source) and (why := offline_reason()):
        ds = _cached_hub_dataset(datasets, source, split, subset, what, why)
    else:
        ds = datasets.load_dataset(source, subset, split=split)
    return ds.to_list()


def _cached_hub_dataset(datasets, source: str, split: str, subset: str | None, what: str, why: str):
    """A hub dataset while the hub cannot be reached: from `datasets`' own cache (where an earlier load
    left it), asked in offline mode so that a dataset not there fails at once, not after a minute of
    huggingface_hub's retries."""
    was = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = True
    try:
        return datasets.load_dataset(source, subset, split=split)
    except ConnectionError:  # not in the cache (OfflineModeIsEnabled is a ConnectionError too)
        args = ", ".join([repr(source), *([repr(subset)] if subset else []), f"split={split!r}"])
        local = source.rsplit("/", 1)[-1] + ".jsonl"
        raise DataError(
            f"{what}: {source} is not a local file or folder nor in the `datasets` cache, and the Hugging Face hub cannot "
            f"be reached ({why}): load it once where there is network, or save it to a file there "
            f"(datasets.load_dataset({args}).to_json({local!r})) and set {what}={local}"
        ) from None
    finally:
        datasets.config.HF_HUB_OFFLINE = was


def _live_rows(source: str, what: str) -> list[dict]:
    try:
        data = live.get(source, what)
    except LookupError as e:
        raise DataError(str(e)) from None
    rows = data.to_list() if hasattr(data, "to_list") else list(data)
    if not all(isinstance(r, dict) for r in rows):
        raise DataError(f"{what}: the dataset's rows must be dicts of columns (a datasets.Dataset or a list of dicts)")
    return rows


def load_rows(
    source: str, *, prompt_column: str = "prompt", split: str = "train", subset: str | None = None, what: str = "data.path"
) -> list[dict]:
    """Rows with the prompt under `prompt`; every other column kept as is. `what`: the setting that named `source`, for errors."""
    p = Path(source)
    if live.is_live(source):  # a datasets.Dataset (or list of dicts) given to rlvr.GRPOTrainer
        rows = _live_rows(source, what)
    elif p.is_file():
        reader = READERS.get(p.suffix.lower())
        if reader is None:
            raise DataError(f"{p}: unsupported file type {p.suffix!r}; use one of {sorted(READERS)}")
        rows = reader(p)
    elif p.suffix.lower() in READERS:
        raise DataError(f"{what}: file not found: {p}")
    else:
        rows = _read_datasets(source, split, subset, what)
    if not rows:
        raise DataError(f"{source}: the dataset is empty")
    if prompt_column not in rows[0]:
        raise DataError(f"{source}: no prompt column {prompt_column!r} (set data.prompt_column); columns found: {sorted(rows[0])}")
    out = []
    for i, row in enumerate(rows):
        if row.get(prompt_column) in (None, ""):
            raise DataError(f"{source}: row {i + 1} has an empty {prompt_column!r}")
        row = dict(row)
        if prompt_column != "prompt":
            row["prompt"] = row.pop(prompt_column)
        out.append(row)
    return out
