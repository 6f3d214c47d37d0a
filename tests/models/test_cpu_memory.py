"""Kept CPU memory (rlvr.models.cpu_memory): a freed large tensor's memory serves the next one without page faults.

Each check runs in its own interpreter: the malloc setting is process-wide and cannot be undone."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")

FAULTS = """
import resource, torch
def faults_per_allocation(n=6, mib=64):
    for _ in range(10):  # the heap grows until glibc's per-thread cache of the small blocks beside them is full
        torch.empty(mib << 18).fill_(1.0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        torch.empty(mib << 18).fill_(1.0)  # 64 MiB of fp32, written, freed
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n
"""


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", FAULTS + textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_a_freed_large_tensor_is_reused_without_faulting_its_pages_in_again():
    out = _run(
        """
        from rlvr.models.cpu_memory import keep_freed_memory
        plain = faults_per_allocation()
        assert keep_freed_memory() and keep_freed_memory()  # in effect, and a second call is harmless
        print(plain, faults_per_allocation())
        """
    )
    plain, kept = map(float, out.split())
    pages = (64 << 20) / 4096
    assert plain > 0.9 * pages  # glibc maps and unmaps every block of 32 MiB or more: each page faults in again
    assert kept < 0.01 * pages  # kept: the freed block is the next one


@pytest.mark.parametrize("keep", [True, False])
def test_training_on_the_cpu_keeps_memory_as_the_config_says(keep):
    out = _run(
        f"""
        from rlvr.config import load_config
        from rlvr.models import cpu_memory
        from rlvr.training.setup import run_device
        cfg = load_config(None, ["device=cpu", "keep_cpu_memory={str(keep).lower()}"])
        assert run_device(cfg).type == "cpu"
        print(cpu_memory._kept, faults_per_allocation())
        """
    )
    kept, faults = out.split()
    assert kept == str(keep)
    assert (float(faults) < 0.01 * (64 << 20) / 4096) is keep
