"""A dataset hub id while the hub cannot be reached fails in seconds with one line naming the
setting and how to give a local file, instead of a minute of huggingface_hub's retries; one that
an earlier load left in the `datasets` cache still loads. The hub is an address that refuses
every connection (HF_ENDPOINT=http://127.0.0.1:9), so nothing here can reach the network."""

import json
import shutil
import time
from pathlib import Path

import pytest

NO_HUB = "http://127.0.0.1:9"
REFUSED = "127.0.0.1:9 cannot be reached (Connection refused)"


def _env(tmp_path: Path) -> dict:
    return {
        "HF_ENDPOINT": NO_HUB,
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
        "HF_HUB_OFFLINE": "0",
        "HF_DATASETS_OFFLINE": "0",
    }  # the reason given is the refused connection


def test_train_on_an_uncached_hub_dataset_offline_fails_fast(tmp_path, rlvr_cli):
    t0 = time.perf_counter()
    proc = rlvr_cli(
        "train",
        "data.path=openai/gsm8k",
        "data.subset=main",
        "data.prompt_column=question",
        "rewards=[math]",
        "steps=1",
        f"output_dir={tmp_path / 'run'}",
        env=_env(tmp_path),
        timeout=60,
    )
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "rlvr: error: data.path: openai/gsm8k is not a local file or folder nor in the `datasets` cache, and the Hugging Face hub cannot "
        f"be reached ({REFUSED}): load it once where there is network, or save it to a file there "
        "(datasets.load_dataset('openai/gsm8k', 'main', split='train').to_json('gsm8k.jsonl')) and set data.path=gsm8k.jsonl"
    ]
    assert "Retrying" not in proc.stdout + proc.stderr
    # fast: no retries against the hub (its backoff alone would add 30 s and more). The bound is relative to a run
    # refused by the config check (the same start-up: 6-7 s on a loaded 2-core machine), with room for importing
    # `datasets` beside a second test worker (12.0 s against 6.1 s measured there)
    t0 = time.perf_counter()
    refused = rlvr_cli("train", "steps=0", f"output_dir={tmp_path / 'run'}", env=_env(tmp_path), timeout=60)
    startup = time.perf_counter() - t0
    assert refused.returncode == 2 and "`steps` must be >= 1" in refused.stderr, refused.stderr[-2000:]
    assert elapsed < 2 * startup + 10, f"took {elapsed:.1f}s, a run refused at start-up {startup:.1f}s"
    assert not (tmp_path / "run").exists()  # refused before any output was written


def test_eval_data_hub_id_offline_names_eval_data(tmp_path, rlvr_cli):
    proc = rlvr_cli(
        "train",
        "eval.data=someone/held-out",
        "eval.reward=math",
        "steps=1",
        f"output_dir={tmp_path / 'run'}",
        env=_env(tmp_path),
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("rlvr: error: eval.data: someone/held-out is not a local file or folder nor in the `datasets` cache")
    assert (
        "(datasets.load_dataset('someone/held-out', split='test').to_json('held-out.jsonl')) and set eval.data=held-out.jsonl"
        in proc.stderr
    )


def _cache_a_dataset(cache: Path, repo: str, config: str, rows: list[dict]) -> None:
    """`datasets`' cache as a load of hub dataset `repo` (configuration `config`) leaves it: built here from a local file."""
    import datasets

    src = cache.parent / "src.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    builder = datasets.load_dataset_builder("json", data_files={"train": str(src)}, cache_dir=str(cache.parent / "build"))
    builder.download_and_prepare()
    built = Path(builder.cache_dir)
    name = repo.split("/")[-1]
    target = cache / repo.replace("/", "___") / config / built.parent.name / built.name
    target.mkdir(parents=True)
    info = json.loads((built / "dataset_info.json").read_text())
    (target / "dataset_info.json").write_text(json.dumps({**info, "config_name": config, "dataset_name": name}))
    shutil.copy(built / "json-train.arrow", target / f"{name}-train.arrow")


def test_a_cached_hub_dataset_loads_offline_without_retries(tmp_path, monkeypatch):
    import datasets
    from huggingface_hub import constants

    from rlvr.data import load_rows
    from rlvr.data.loaders import DataError

    _cache_a_dataset(tmp_path / "datasets", "someone/tiny_set", "main", [{"question": f"q{i}", "answer": str(i)} for i in range(3)])
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setattr(constants, "ENDPOINT", NO_HUB)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    t0 = time.perf_counter()
    rows = load_rows("someone/tiny_set", subset="main", prompt_column="question")
    assert time.perf_counter() - t0 < 10
    assert rows == [{"prompt": f"q{i}", "answer": str(i)} for i in range(3)]
    assert datasets.config.HF_HUB_OFFLINE is False  # offline mode only for that call
    with pytest.raises(DataError) as refused:
        load_rows("someone/other")
    assert str(refused.value).startswith(
        "data.path: someone/other is not a local file or folder nor in the `datasets` cache, and the "
        f"Hugging Face hub cannot be reached ({REFUSED})"
    )
