"""The C kernels' other instruction-set paths. Each kernel (rlvr.models.native_*, rlvr.rollout.engines.hf.native_*)
has an AVX-512 or AVX2 path and plain C for the rest, and -march=native builds only the paths of the machine it runs
on: an AVX-512 machine never runs the AVX2 path a Zen 3 or a laptop runs, nor the plain C an ARM runs. Here the
kernels' own tests (torch's bits, the float64 truth, the model forwards) run again in a process whose kernels are built
for an older -march (RLVR_NATIVE_MARCH), and the test checks that process's builds hold none of the newer registers."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNEL_TESTS = [
    "tests/models/test_native_swiglu.py",
    "tests/models/test_norm_rotary.py",
    "tests/rollout/test_native_attention.py",
    "tests/models/test_native_norm.py",
    "tests/models/test_native_logprobs.py",
    "tests/rollout/test_native_sampler.py",
    "tests/rollout/test_native_rotary.py",
    "tests/rollout/test_native_prefix.py",
    "tests/models/test_softmax_pair.py",
    "tests/models/test_native_grad_sum.py",
    "tests/models/test_native_linear.py",
    "tests/models/test_native_causal_attention.py",
]
# how the kernels are built is the same for every -march (test_native_attention's build tests): once is enough
BUILD_TESTS = "not built_once and not only_gcc and not failed_build"
# -march -> registers its builds must not use (x86-64-v3: AVX2 but no AVX-512; x86-64-v2: SSE only, the plain C paths)
MARCHES = {"x86_64": {"x86-64-v3": ("zmm",), "x86-64-v2": ("zmm", "ymm")}}.get(platform.machine(), {})


@pytest.mark.parametrize("march", sorted(MARCHES))
def test_kernel_tests_pass_built_for_an_older_march(march, tmp_path):
    cache = tmp_path / "precision.json"  # the child's kernels build into cache's folder, apart from this process's
    env = {**os.environ, "RLVR_NATIVE_MARCH": march, "RLVR_PRECISION_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    # -p no:xdist: the tests in this one process; the conftest's cache fixture gives it a folder of its own under tmp
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-k", BUILD_TESTS, *KERNEL_TESTS]
    cmd += ["--basetemp", str(tmp_path / "child")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
    built = sorted((tmp_path / "child").rglob("native*.so"))
    names = {p.name.split("-")[0] for p in built}
    assert names >= {"native_attention", "native_logprobs", "native_norm", "native_rotary", "native_swiglu", "native_training_norm"}
    assert names >= {"native_sampler", "native_training_rotary", "native_prefix", "native_softmax_pair", "native_grad_sum", "native_linear"}
    assert "native_causal_attention" in names
    for path in built:
        code = subprocess.run(["objdump", "-d", str(path)], capture_output=True, text=True, check=True).stdout
        for register in MARCHES[march]:
            assert f"%{register}" not in code, f"{path.name} built for -march={march} uses {register} registers"
