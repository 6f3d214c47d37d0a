"""The decode's C attention kernel (rlvr.rollout.engines.hf.native_attention) and its build (rlvr.models.native_build):
the float64 attention's output and log-sum-exp to float rounding, from fp32 buffers and from bf16 ones (widened
exactly), over strided buffers, left padding, a mask shared by every row or none, and only the slots asked for; the
same bits at any thread count; built once per machine into the cache folder, and None with the compiler's words where
it does not build."""

import os
import subprocess
import sys

import pytest
import torch

import rlvr.rollout.engines.hf.native_attention as native_attention
from rlvr.models import native_build


def _truth(q, k, v, scale, bias, length):
    """float64 attention over slots 0..length-1: output [n, H, R, D] and log-sum-exp [n, H, R]."""
    keys, values = k[:, :, :length].double(), v[:, :, :length].double()
    s = torch.einsum("nhrd,nhsd->nhrs", q.double(), keys) * scale
    if bias is not None:
        s = s + bias[..., :length].double()
    return torch.einsum("nhrs,nhsd->nhrd", s.softmax(-1), values), s.logsumexp(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("R, D", [(1, 64), (3, 40), (8, 19), (2, 128), (4, 8), (20, 16)])  # 20: past the registers (MAX_R)
@pytest.mark.parametrize("mask", ["rows", "shared", "none"])
def test_the_kernel_is_the_float64_attention(dtype, R, D, mask):
    assert native_attention.available(), native_build.why_not(native_attention.SOURCE)  # a compiler: CI's machines have one
    torch.manual_seed(R * D)
    n, H, S, length = 6, 3, 23, 17
    q = torch.randn(n, H, R, D) * 2
    # buffers as the decode holds them after a compaction or a grow: rows and slots strided, the last dim contiguous
    k = (torch.randn(2 * n, H, S + 5, D) * 2).to(dtype)[::2, :, 2 : S + 2]
    v = torch.randn(n, H + 1, S, D).to(dtype)[:, 1:]
    bias = None
    if mask == "rows":  # left padding of several widths, slots after `length` masked too (not read either way)
        bias = torch.zeros(n, 1, 1, S)
        for row in range(n):
            bias[row, ..., : row % 4] = float("-inf")
        bias[..., length:] = float("-inf")
    elif mask == "shared":
        bias = torch.zeros(1, 1, 1, S)
        bias[..., :2] = float("-inf")
    out, lse = native_attention.native_attention(q, k, v, D**-0.5, bias, length)
    truth, truth_lse = _truth(q, k, v, D**-0.5, bias, length)  # the bf16 buffers as they are: widening is exact
    assert out.dtype == lse.dtype == torch.float32 and out.shape == (n, H, R, D) and lse.shape == (n, H, R)
    torch.testing.assert_close(out.double(), truth, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(lse.double(), truth_lse, rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("R, D", [(1, 32), (2, 64), (3, 19)])
def test_query_rows_read_buffer_rows_of_their_own_to_lengths_of_their_own(dtype, R, D):
    """Multi-turn episodes: query row i reads buffer row rows[i] (and its bias row) up to lengths[i] slots: each row's
    output is the float64 attention over exactly those slots, and NaN in any slot past a row's length changes nothing."""
    torch.manual_seed(D)
    N, H, S = 7, 2, 30
    rows, lengths = torch.tensor([5, 0, 3, 6]), torch.tensor([9, 1, 30, 17])
    q = torch.randn(len(rows), H, R, D)
    k, v = (torch.randn(N, H, S, D) * 2).to(dtype), torch.randn(N, H, S, D).to(dtype)
    bias = torch.zeros(N, 1, 1, S)
    bias[3, ..., :2] = bias[5, ..., 1] = float("-inf")  # the prompt's left padding, per buffer row
    for row, length in zip(rows.tolist(), lengths.tolist()):
        k[row, :, length:], v[row, :, length:] = float("nan"), float("nan")
    out, lse = native_attention.native_attention(q, k, v, D**-0.5, bias, S, rows=rows, lengths=lengths)
    assert out.shape == (len(rows), H, R, D) and lse.shape == (len(rows), H, R)
    for i, (row, length) in enumerate(zip(rows.tolist(), lengths.tolist())):
        truth, truth_lse = _truth(q[i : i + 1], k[row : row + 1], v[row : row + 1], D**-0.5, bias[row : row + 1], length)
        torch.testing.assert_close(out[i : i + 1].double(), truth, rtol=1e-5, atol=2e-6)
        torch.testing.assert_close(lse[i : i + 1].double(), truth_lse, rtol=1e-6, atol=2e-6)
        # the same bits as the call for that row alone over a buffer of just its slots
        alone = native_attention.native_attention(q[i : i + 1], k[row : row + 1], v[row : row + 1], D**-0.5, bias[row : row + 1], length)
        assert torch.equal(out[i : i + 1], alone[0]) and torch.equal(lse[i : i + 1], alone[1])


def test_slots_after_the_length_and_masked_slots_are_not_read():
    """NaN in every slot the kernel must not read (after `length`, or masked -inf) leaves the output finite and equal."""
    torch.manual_seed(0)
    n, H, R, S, D, length = 4, 2, 2, 12, 16, 7
    q, k, v = torch.randn(n, H, R, D), torch.randn(n, H, S, D), torch.randn(n, H, S, D)
    bias = torch.zeros(n, 1, 1, S)
    bias[0, ..., :3] = float("-inf")
    clean = native_attention.native_attention(q, k, v, 0.25, bias, length)
    k[:, :, length:], v[:, :, length:] = float("nan"), float("nan")
    k[0, :, :3], v[0, :, :3] = float("nan"), float("nan")
    dirty = native_attention.native_attention(q, k, v, 0.25, bias, length)
    assert torch.equal(clean[0], dirty[0]) and torch.equal(clean[1], dirty[1])


def test_the_same_bits_at_any_thread_count():
    torch.manual_seed(1)
    q, k, v = torch.randn(8, 4, 2, 32), torch.randn(8, 4, 40, 32), torch.randn(8, 4, 40, 32)
    threads = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(native_attention.native_attention(q, k, v, 0.2, None, 33))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(o[0], outs[0][0]) and torch.equal(o[1], outs[0][1]) for o in outs[1:])


def _load_in_a_new_process(cache: str, cc: str | None = None) -> str:
    """A new process's native_build.load of the kernel: 'loaded', or why_not's words."""
    env = dict(os.environ, RLVR_PRECISION_CACHE=cache, PYTHONPATH=os.pathsep.join(sys.path))
    if cc is not None:
        env["CC"] = cc
    code = (
        "from rlvr.models import native_build; from rlvr.rollout.engines.hf.native_attention import SOURCE; "
        "print('loaded' if native_build.load(SOURCE) is not None else native_build.why_not(SOURCE))"
    )
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_built_once_per_machine_into_the_cache_folder(tmp_path):
    cache = str(tmp_path / "precision.json")
    assert _load_in_a_new_process(cache) == "loaded"
    (built,) = (tmp_path / "native").glob("native_attention-*.so")
    stamp = built.stat().st_mtime_ns
    assert _load_in_a_new_process(cache) == "loaded" and built.stat().st_mtime_ns == stamp  # read back, not built again
    assert [p.name for p in (tmp_path / "native").iterdir()] == [built.name]  # no temporary file left


GCC_VERSION = "cc (Debian 12.2.0-14) 12.2.0\\nCopyright (C) 2022 Free Software Foundation, Inc."  # the first two lines


def _compiler(tmp_path, version: str, compiles: bool) -> str:
    """A stand-in compiler: prints `version` for --version, else fails (or hands the call to gcc)."""
    script = tmp_path / "cc"
    run = 'exec gcc "$@"' if compiles else 'echo "cc: error: no room on the device" >&2; exit 1'
    script.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then printf "{version}\\n"; exit 0; fi\n{run}\n')
    script.chmod(0o755)
    return str(script)


def test_a_failed_build_says_why_and_leaves_no_file(tmp_path):
    """A compile that fails: None, with the command, its exit status and its words; the decode keeps its torch ways."""
    words = _load_in_a_new_process(str(tmp_path / "precision.json"), cc=_compiler(tmp_path, GCC_VERSION, compiles=False))
    assert "exited 1" in words and "no room on the device" in words and "native_attention.c" in words, words
    assert not (tmp_path / "native").exists() or not any((tmp_path / "native").iterdir())


def test_only_gcc_builds_it(tmp_path):
    """Another compiler's -fopenmp would link its own OpenMP runtime beside torch's libgomp: not built."""
    words = _load_in_a_new_process(str(tmp_path / "precision.json"), cc=_compiler(tmp_path, "clang version 18.1.3", compiles=True))
    assert "is not GCC" in words and "clang version 18.1.3" in words, words
