"""native_lanes.h's store of a whole vector as one memcpy of constant size (a vector store) against one of n floats
(GCC calls memcpy for each: how every vector of a row was stored before 2026-12-07), in the kernels built without
AVX-512 (GCC's vector extensions; the AVX-512 build stores through masks either way). Times native_softmax_pair.c's
forward and backward at config F's training shape (4 prompts x 2 kv heads x 16 rows x 4 query heads x 48 completion
tokens, 260 prompt keys, fp32), each build alone in one process, best of `--reps` alternating calls, and checks that
both give the same bits. The "before" build is the kernel with the header's old store, compiled from a copy.

    cd bench && python lanes_store_ab.py --reps 10 --out results/lanes_store_avx2.md && cd ..
"""

from __future__ import annotations

import argparse
import ctypes
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from _report import emit, result_head, table_row
from rlvr.models import native_build, native_softmax_pair

OLD_STORE = """INLINE void store(void *out, int64_t j, int64_t n, vec d, int bf16) {
    if (!bf16) {
        memcpy((float *)out + j, &d, (size_t)n * sizeof(float));
        return;
    }
    vuint u = (vuint)d;
    vuint rounded = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) | ((vuint)(d != d) & 0xffffu); /* a NaN: 0xffff */
    vhalf h = __builtin_convertvector(rounded, vhalf);
    memcpy((uint16_t *)out + j, &h, (size_t)n * sizeof(uint16_t));
}
"""
_P, _I = ctypes.c_void_p, ctypes.c_int64
ARGS = (_P, _P, _P, _P, _I, _I, _I, ctypes.c_int, ctypes.c_int, _P, _P, _I, _I, _I, _I, _I, _I, ctypes.c_int)
U, HKV, G, R, C, P = 4, 2, 16, 4 * 48, 48, 260  # config F's training micro-batch: its scores' rows and widths


def time_builds(kernels: dict, dtype: torch.dtype, reps: int, threads: int) -> tuple[dict, dict]:
    """({(build, phase): best ms}, {phase: whether the builds gave the same bits}) of rlvr_softmax_pair `kernels`
    (build -> function) at config F's scores in `dtype`, forward and backward, `reps` alternating calls each."""
    rows = U * HKV * G * R
    a0, b0, bias = torch.randn(rows, P).to(dtype), torch.randn(rows, C).to(dtype), torch.zeros(C, C, dtype=dtype)
    best: dict[tuple[str, str], float] = {}
    outputs: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for i in range(reps):
        for way in list(kernels) if i % 2 == 0 else list(kernels)[::-1]:
            for phase, back in (("forward", 0), ("backward", 1)):
                a, b = a0.clone(), b0.clone()
                t = time.perf_counter()
                kernels[way](
                    a.data_ptr(), b.data_ptr(), a0.data_ptr() if back else None, b0.data_ptr() if back else None, rows, P, C,
                    int(dtype == torch.bfloat16), back, None, None if back else bias.data_ptr(), 0, 0, C, U, G, R, threads,
                )  # fmt: skip
                best[way, phase] = min(best.get((way, phase), float("inf")), time.perf_counter() - t)
                outputs[way, phase] = (a, b)
    first, second = list(kernels)[:2]
    same = {ph: all(torch.equal(x, y) for x, y in zip(outputs[first, ph], outputs[second, ph])) for ph in ("forward", "backward")}
    return {k: v * 1e3 for k, v in best.items()}, same


def before_source(folder: Path) -> Path:
    """native_softmax_pair.c beside a native_lanes.h whose generic store is the old one (and a comment that gives the
    copy a build of its own in the machine cache)."""
    here = Path(native_softmax_pair.SOURCE).parent
    for header in here.glob("*.h"):
        shutil.copy(header, folder / header.name)
    lanes = (folder / "native_lanes.h").read_text()
    new = re.search(r"/\* a whole vector through a memcpy.*?\n}\n", lanes, re.S)
    assert new is not None, "native_lanes.h's store is not the one this bench replaces"
    (folder / "native_lanes.h").write_text(lanes.replace(new.group(0), OLD_STORE))
    source = folder / "native_softmax_pair.c"
    source.write_text(Path(native_softmax_pair.SOURCE).read_text() + "\n/* lanes_store_ab: the old store */\n")
    return source


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        builds = {"before": before_source(Path(tmp)), "after": Path(native_softmax_pair.SOURCE)}
        kernels = {way: native_build.function(src, "rlvr_softmax_pair", ARGS, ctypes.c_int) for way, src in builds.items()}
    assert all(kernels.values()), {way: native_build.why_not(src) for way, src in builds.items()}
    ms, same = time_builds(kernels, torch.float32, args.reps, args.threads)
    torch.set_num_threads(args.threads)
    rows = U * HKV * G * R
    lines = result_head(
        "native_lanes.h's whole-vector store against a store of n floats (native_softmax_pair.c)",
        "cd bench && python lanes_store_ab.py " + shlex.join(sys.argv[1:]),
        f"best of {args.reps} alternating calls per build and phase, fp32 scores [{rows}, {P}] and [{rows}, {C}]",
        ["phase", "before ms", "after ms", "after / before", "same bits"],
    )
    for phase in ("forward", "backward"):
        before, after = ms["before", phase], ms["after", phase]
        lines.append(table_row(phase, f"{before:.2f}", f"{after:.2f}", f"{after / before:.2f}", same[phase]))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
