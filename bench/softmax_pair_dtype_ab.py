"""native_softmax_pair.c against its source at another commit (default: before its rows went through one noinline
function per dtype), at config F's training shape (4 prompts x 2 kv heads x 16 rows x 4 query heads x 48 completion
tokens, 259 prompt keys), fp32 and bf16: each build's forward and backward, best of `--reps` alternating calls, and
whether both give the same bits. The other build is compiled from that commit's file beside this tree's headers.

    python bench/softmax_pair_dtype_ab.py --before f95938c --reps 10 --out bench/results/softmax_pair_dtype_avx2.md
"""

from __future__ import annotations

import argparse
import ctypes
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _report import cpu_name, table_row  # noqa: E402

from rlvr.models import native_build, native_softmax_pair  # noqa: E402

P_, I_ = ctypes.c_void_p, ctypes.c_int64
ARGS = (P_, P_, P_, P_, I_, I_, I_, ctypes.c_int, ctypes.c_int, P_, P_, I_, I_, I_, I_, I_, I_, ctypes.c_int)
U, HKV, G, R, C, P = 4, 2, 16, 4 * 48, 48, 259  # config F's training micro-batch


def builds(before: str, tmp: Path) -> dict:
    """{"before": that commit's kernel, "after": this tree's}, each built from a copy beside this tree's headers."""
    models = Path(native_softmax_pair.SOURCE).parent
    for header in models.glob("native_*.h"):
        shutil.copy(header, tmp / header.name)
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=HERE, capture_output=True, text=True, check=True).stdout.strip()
    rel = Path(native_softmax_pair.SOURCE).resolve().relative_to(root)
    old = subprocess.run(["git", "show", f"{before}:{rel}"], cwd=root, capture_output=True, text=True, check=True).stdout
    (tmp / "before_softmax_pair.c").write_text(old)
    shutil.copy(native_softmax_pair.SOURCE, tmp / "after_softmax_pair.c")
    return {w: native_build.function(tmp / f"{w}_softmax_pair.c", "rlvr_softmax_pair", ARGS, ctypes.c_int) for w in ("before", "after")}


def measure(fns: dict, dtype: torch.dtype, reps: int) -> tuple[dict, bool]:
    """Best seconds per (way, direction), and whether the ways gave the same bits."""
    rows = U * HKV * G * R
    g = torch.Generator().manual_seed(0)
    a0, b0 = torch.randn(rows, P, generator=g).to(dtype), torch.randn(rows, C, generator=g).to(dtype)
    bias = torch.zeros(C, C, dtype=dtype)
    best: dict = {}
    out: dict = {}
    for i in range(reps):
        for way in list(fns) if i % 2 == 0 else list(fns)[::-1]:
            for back in (0, 1):
                a, b = a0.clone(), b0.clone()
                pa, pb = (a0.data_ptr(), b0.data_ptr()) if back else (None, None)
                t = time.perf_counter()
                fns[way](a.data_ptr(), b.data_ptr(), pa, pb, rows, P, C, int(dtype == torch.bfloat16), back, None,
                         None if back else bias.data_ptr(), 0, 0, C, U, G, R, 2)  # fmt: skip
                s = time.perf_counter() - t
                best[(way, back)] = min(best.get((way, back), s), s)
                out[(way, back)] = (a, b)
    same = all(torch.equal(out[("before", k)][j], out[("after", k)][j]) for k in (0, 1) for j in (0, 1))
    return best, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="f95938c")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="bench/results/softmax_pair_dtype.md")
    args = ap.parse_args()
    torch.set_num_threads(2)
    lines = [
        f"# native_softmax_pair.c at {args.before} against this tree",
        "",
        f"Command: `python bench/softmax_pair_dtype_ab.py {shlex.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, torch {torch.__version__}, 2 threads; vector bits {native_softmax_pair.vector_bits()}. "
        f"Config F's scores ({U * HKV * G * R} rows of {P} + {C}), best of {args.reps} alternating calls a build.",
        "",
        table_row("dtype", "direction", "before ms", "after ms", "after / before", "same bits"),
        table_row(*["---"] * 6),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        fns = builds(args.before, Path(tmp))
        for dtype in (torch.float32, torch.bfloat16):
            best, same = measure(fns, dtype, args.reps)
            for back, name in ((0, "forward"), (1, "backward")):
                b, a = best[("before", back)] * 1e3, best[("after", back)] * 1e3
                row = (str(dtype).removeprefix("torch."), name, f"{b:.2f}", f"{a:.2f}", f"{a / b:.2f}", same)
                print(*row, flush=True)
                lines.append(table_row(*row))
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
