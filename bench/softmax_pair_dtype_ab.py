"""native_softmax_pair.c against its source at another commit (default: before its rows went through one noinline
function per dtype), at config F's training shape (lanes_store_ab.time_builds: 4 prompts x 2 kv heads x 16 rows x 4
query heads x 48 completion tokens, 260 prompt keys), fp32 and bf16: each build's forward and backward, best of `--reps`
alternating calls, and whether both give the same bits. The other build is compiled from that commit's file beside this tree's headers.

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
from lanes_store_ab import ARGS, HKV, C, G, P, R, U, time_builds  # noqa: E402

from rlvr.models import native_build, native_softmax_pair  # noqa: E402


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
            ms, same = time_builds(fns, dtype, args.reps, 2)
            for name in ("forward", "backward"):
                b, a = ms["before", name], ms["after", name]
                row = (str(dtype).removeprefix("torch."), name, f"{b:.2f}", f"{a:.2f}", f"{a / b:.2f}", same[name])
                print(*row, flush=True)
                lines.append(table_row(*row))
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
