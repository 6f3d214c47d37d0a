"""The decode's C attention kernel (rlvr/rollout/engines/hf/native_attention.c) of another commit against this tree's,
in one process: bench/generation_ab.py's generation of a floor config, `--reps` times per kernel, alternating. Both
files are built (rlvr.models.native_build) and swapped in as the module's kernels; they sum in other orders, so the
table gives whether the tokens are the same and the largest log-prob gap.

    cd bench && python native_attention_versions_ab.py B E J L --before 5824ae5 --reps 6 --out results/x.md && cd ..
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import rlvr.rollout.engines.hf.native_attention as native_attention
from generation_ab import generation_ab
from _report import emit, result_head, table_row
from rlvr.models import native_build

PATH = "src/rlvr/rollout/engines/hf/native_attention.c"
NAMES = {torch.float32: "rlvr_attend_f32", torch.bfloat16: "rlvr_attend_bf16"}


def kernels(source: Path) -> dict:
    built = {dtype: native_build.function(source, name, native_attention._ARGS) for dtype, name in NAMES.items()}
    assert None not in built.values(), native_build.why_not(source)
    return built


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["B"])
    ap.add_argument("--before", required=True, help="the commit whose kernel file is 'before'")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    text = subprocess.run(["git", "show", f"{args.before}:{PATH}"], cwd=root, capture_output=True, text=True, check=True).stdout
    old = Path(tempfile.mkdtemp()) / "native_attention_before.c"
    old.write_text(text)
    versions = {f"before ({args.before})": kernels(old), "after (this tree)": kernels(native_attention.SOURCE)}
    ways = {name: (lambda k=k: setattr(native_attention, "_kernels", lambda: k)) for name, k in versions.items()}
    lines = result_head(
        "The decode's C attention kernel: another commit's against this tree's",
        f"cd bench && python native_attention_versions_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config, the same generation {args.reps} times per kernel, alternating which goes first",
        ["config", "precision", *(f"{w} s" for w in ways), "after / before (medians)", "same tokens", "largest log-prob gap"],
    )
    first, second = ways
    for name in args.configs:
        trainer, outputs, seconds = generation_ab(name, ways, args.reps)
        same = all(torch.equal(a.completion_ids, b.completion_ids) for a, b in zip(outputs[first], outputs[second]))
        gap = max(float((a.sampling_logprobs - b.sampling_logprobs).abs().max()) for a, b in zip(outputs[first], outputs[second]))
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in ways]
        ratio = statistics.median(seconds[second]) / statistics.median(seconds[first])
        lines.append(table_row(name, trainer.precision.name, *runs, f"{ratio:.3f}", same, f"{gap:.1e}"))
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
