"""Answers measured once per machine, kept in small JSON files under ~/.cache/rlvr/ (the folder of
$RLVR_PRECISION_CACHE when set): the precision `model.autocast=auto` chose (precision_choice), which fp32
weight shapes decode faster packed (packed_linears), which kernel the decode's shared-prompt attention runs
(rollout.engines.hf.decode_attention). Written whole and renamed into place, so a run reading a file while
another writes it sees the old or the new one. Keys name the machine (the CPU as cpu_identity tells it, torch,
threads), so a file copied to another machine measures there again; delete a file to measure again."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

CACHE_ENV = "RLVR_PRECISION_CACHE"


def precision_cache_path() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rlvr" / "precision.json")


def machine_memory_bytes() -> int:
    """This machine's memory: the physical memory, or a container's cgroup (v2) limit where lower; 8 GiB where
    neither can be read."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        physical = 8 * 2**30
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        return min(physical, int(limit)) if limit.isdigit() else physical
    except OSError:
        return physical


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_fields() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ("model name", "flags", ...; the processors are alike), none
    where there is no such file."""
    fields: dict[str, str] = {}
    for line in _cpuinfo().splitlines():
        if not line.strip():
            break
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (else platform.processor())."""
    return cpu_fields().get("model name") or platform.processor() or "unknown"


def cpu_identity() -> str:
    """The CPU as the caches' keys name it: its model name, and where /proc/cpuinfo has them its family, model and
    stepping numbers and a digest of its feature flags. A cloud VM's CPU often has a generic name ("Intel(R) Xeon(R)
    Processor") shared by several generations, and VMs of one generation differ in the features they pass through
    (avx512_bf16 on one, none on the next): a choice timed on one (bf16 autocast, a packed product, an attention
    kernel) would be read back on the other, where it may run several times slower."""
    fields = cpu_fields()
    parts = [cpu_model()]
    if all(k in fields for k in ("cpu family", "model", "stepping")):
        parts.append(f"{fields['cpu family']}-{fields['model']}-{fields['stepping']}")
    flags = fields.get("flags") or fields.get("Features")  # x86 / arm
    if flags:
        parts.append("flags " + hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:12])
    return ", ".join(parts)


def read_cache(path: Path) -> dict:
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: time again and rewrite it
        return {}
    return cache if isinstance(cache, dict) else {}


def write_cache(path: Path, cache: dict) -> None:
    """Whole-file replace, so a run reading it at the same time sees the old or the new file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
    except OSError:  # a read-only home: the choice still stands for this run
        pass


def measured_once(name: str, shape: dict, measure: Callable[[], dict]) -> dict:
    """The entry for `shape` on this machine in `name`.json beside the precision cache: read from the file, or
    `measure()`d now and written there. A measurement draws its random data from a fork of torch's generator: a run
    takes the same random numbers whether the file held the answer or not (the draws a run makes after it, such as
    Clip-Cov's tokens, once differed between a first run on a machine and the next)."""
    path = precision_cache_path().with_name(f"{name}.json")
    key = json.dumps({"cpu": cpu_identity(), "torch": torch.__version__, "threads": torch.get_num_threads()} | shape, sort_keys=True)
    entry = read_cache(path).get(key)
    if not isinstance(entry, dict):
        with torch.random.fork_rng(devices=[]):
            entry = measure()
        write_cache(path, {**read_cache(path), key: entry})
    return entry


def power_of_two_at_least(n: int) -> int:
    """The bucket a measured shape's length falls in: 1, 2, 4, 8, ..."""
    return 1 << max(n - 1, 0).bit_length()


def fastest_times(ways: Sequence[Callable[[], object]], rounds: int = 5) -> list[float]:
    """Seconds per call of each way, the best of `rounds` runs of enough calls for about 2 ms each, the ways
    alternating within every round (a burst of other work on the machine then hits them alike)."""
    start = time.perf_counter()
    for way in ways:
        way()
    calls = max(3, min(200, int(len(ways) * 2e-3 / max(time.perf_counter() - start, 1e-7))))
    best = [float("inf")] * len(ways)
    for _ in range(rounds):
        for i, way in enumerate(ways):
            start = time.perf_counter()
            for _ in range(calls):
                way()
            best[i] = min(best[i], (time.perf_counter() - start) / calls)
    return best
