"""fp32 products from panels in C (rlvr.models.native_linear): each output one chain of fused multiply-adds over the
input in order. The chains are pinned by the plain C build (C's fmaf rounds each step once) giving the vector build's
bits; a row's outputs are the same in calls of any rows, threads and neighbouring weights (q/k/v packed together);
the result is within the float rounding bound of the float64 truth; shapes off every block edge, biases, strided rows."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from rlvr.models import native_build, native_linear

ROOT = Path(__file__).resolve().parents[2]
# (rows, in, out): 1 row, rows off the 4-row block, outputs off the 24- or 48-wide panel, a decode step's shapes
SHAPES = [(1, 7, 5), (3, 33, 25), (5, 256, 24), (17, 300, 130), (64, 256, 103), (64, 256, 768), (250, 512, 49)]


@pytest.fixture(autouse=True)
def built():
    assert native_linear.available(), native_build.why_not(native_linear.SOURCE)  # a compiler: CI's machines have one


def _data(rows, k, n, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-3, 3, k)  # terms of very different sizes: sums that round
    x, w = torch.randn(rows, k, generator=g) * scales, torch.randn(n, k, generator=g)
    return x, w, (torch.randn(n, generator=g) if bias else None)


def _within_rounding(y, x, w, b):
    """|y - truth| within the bound of a K-term float sum (and one add of the bias), the truth in float64."""
    x64, w64 = x.double(), w.double()
    truth = x64 @ w64.T + (0 if b is None else b.double())
    bound = (x64.abs() @ w64.abs().T) * x.shape[1] * 2.0**-24 + (0 if b is None else truth.abs() * 2.0**-24)
    return bool(((y.double() - truth).abs() <= bound).all())


@pytest.mark.parametrize("rows,k,n", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_products_are_within_float_rounding_of_the_truth(rows, k, n, bias):
    x, w, b = _data(rows, k, n, bias=bias)
    y = native_linear.linear(x, native_linear.pack([w]), b, n)
    assert y.shape == (rows, n) and y.dtype == torch.float32
    assert _within_rounding(y, x, w, b)
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=0, atol=2e-5 * float((x.abs() @ w.abs().T).max()))


@pytest.mark.parametrize("rows,k,n", SHAPES)
def test_a_rows_outputs_do_not_depend_on_the_call(rows, k, n):
    """Each row alone, the rows in uneven slices, one thread or three: the same bits (a decode step's row gives what
    the same row gave in a prefill's call)."""
    x, w, b = _data(rows, k, n, seed=1, bias=True)
    packed = native_linear.pack([w])
    whole = native_linear.linear(x, packed, b, n)
    assert torch.equal(torch.cat([native_linear.linear(x[i : i + 1], packed, b, n) for i in range(rows)]), whole)
    cuts = [0, *sorted({rows // 3, rows // 2 + 1}), rows]
    pieces = [native_linear.linear(x[a:c], packed, b, n) for a, c in zip(cuts, cuts[1:]) if c > a]
    assert torch.equal(torch.cat(pieces), whole)
    threads = torch.get_num_threads()
    try:
        for t in (1, 3):
            torch.set_num_threads(t)
            assert torch.equal(native_linear.linear(x, packed, b, n), whole)
    finally:
        torch.set_num_threads(threads)


def test_weights_packed_side_by_side_give_each_its_own_bits():
    """q, k and v as one packed weight (the lean decode's fusion): each part exactly its own product."""
    x, _, _ = _data(24, 256, 1, seed=2)
    g = torch.Generator().manual_seed(3)
    weights = [torch.randn(o, 256, generator=g) for o in (256, 128, 128)]
    biases = [torch.randn(o, generator=g) for o in (256, 128, 128)]
    fused = native_linear.linear(x, native_linear.pack(weights), torch.cat(biases), 512)
    apart = [native_linear.linear(x, native_linear.pack([w]), b, w.shape[0]) for w, b in zip(weights, biases)]
    assert torch.equal(fused, torch.cat(apart, -1))


def test_inputs_of_more_dimensions_and_strided_rows():
    x, w, b = _data(12, 96, 40, seed=4, bias=True)
    packed = native_linear.pack([w])
    flat = native_linear.linear(x, packed, b, 40)
    assert torch.equal(native_linear.linear(x.view(3, 4, 96), packed, b, 40), flat.view(3, 4, 40))
    wide = torch.zeros(12, 200)
    wide[:, 50:146] = x  # rows 200 apart, the input contiguous within each
    assert torch.equal(native_linear.linear(wide[:, 50:146], packed, b, 40), flat)
    assert torch.equal(native_linear.linear(x.T.contiguous().T, packed, b, 40), flat)  # columns apart: copied
    assert native_linear.linear(x[:0], packed, b, 40).shape == (0, 40)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 -march levels")  # the ARM build is plain C itself
def test_the_plain_c_build_gives_the_vector_builds_bits(tmp_path):
    """C's fmaf rounds once per step, by the standard: the plain C build (x86-64-v2) is the chains' definition, and the
    AVX2 / AVX-512 builds must give its bits."""
    rows, k, n = 37, 300, 130
    x, w, b = _data(rows, k, n, seed=5, bias=True)
    torch.save({"x": x, "w": w, "b": b}, tmp_path / "data.pt")
    code = (
        "import torch, sys; from rlvr.models import native_linear as nl; d = torch.load(sys.argv[1]);"
        f"torch.save(nl.linear(d['x'], nl.pack([d['w']]), d['b'], {n}), sys.argv[2])"
    )
    env = {**os.environ, "RLVR_NATIVE_MARCH": "x86-64-v2", "RLVR_PRECISION_CACHE": str(tmp_path / "precision.json")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-c", code, str(tmp_path / "data.pt"), str(tmp_path / "y.pt")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    built = list((tmp_path / "native").glob("native_linear-*.so"))
    assert len(built) == 1 and "%ymm" not in subprocess.run(["objdump", "-d", str(built[0])], capture_output=True, text=True).stdout
    plain = torch.load(tmp_path / "y.pt")
    assert torch.equal(native_linear.linear(x, native_linear.pack([w]), b, n), plain)
