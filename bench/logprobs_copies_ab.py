"""algo.token_logprobs as at git REF against this tree's, in one process, alternating: the forward + backward alone at
vocabulary-wide shapes, then a training micro-batch of bench/floor.py configs with each version's autograd node in
place (monkeypatched, the rest of the code this tree's). Each way's log-probs, entropies and gradients must be the
same bits: checked here too.

    python bench/logprobs_copies_ab.py --before 4bcff5f --configs V,Q --shape 'Q={"llama": {...}, ...}' --out bench/results/x.md

Made for the change that took the chunk copies out (fp32 logits: the backward works in the gradient's own slices, and
at temperature 1 both directions write x - max x straight from the logits, with no copy of each chunk first).
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from _report import result_head  # noqa: E402

from rlvr.algo import logprobs  # noqa: E402

SHAPES = [(56, 64, 32000), (32, 64, 49152), (16, 48, 151936), (64, 72, 103)]  # [rows, tokens, V]: V, S, Q, B


def module_at(ref: str):
    """rlvr/algo/logprobs.py as at git `ref`, imported as a module of its own."""
    text = subprocess.run(["git", "show", f"{ref}:src/rlvr/algo/logprobs.py"], cwd=HERE.parent, check=True, capture_output=True).stdout
    path = Path(tempfile.mkdtemp(prefix="rlvr_logprobs_")) / "logprobs_before.py"
    path.write_bytes(text)
    spec = importlib.util.spec_from_file_location("logprobs_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pass(module, base: torch.Tensor, index: torch.Tensor, coef: torch.Tensor, temperature: float):
    x = base.detach().requires_grad_(True)
    logp, entropy = module.token_logprobs(x, index, temperature=temperature, with_entropy=True, entropy_grad=True)
    ((logp + 0.01 * entropy) * coef).sum().backward()
    return logp.detach(), entropy.detach(), x.grad


def ops_alone(before, reps: int) -> list[str]:
    """Table rows: each shape, dtype and temperature, the forward + backward per way (medians), and whether equal."""
    rows = []
    for (N, L, V), dtype, T in [(s, d, t) for s in SHAPES for d in (torch.float32, torch.bfloat16) for t in (1.0, 0.7)]:
        g = torch.Generator().manual_seed(N * V)
        base = (torch.randn(N, L + 1, V, generator=g) * 4).to(dtype)
        index, coef = torch.randint(0, V, (N, L), generator=g), torch.randn(N, L, generator=g)
        times: dict[str, list[float]] = {"before": [], "after": []}
        outs = {}
        for i in range(reps + 1):
            for way in ("before", "after") if i % 2 == 0 else ("after", "before"):
                t = time.perf_counter()
                outs[way] = _pass(before if way == "before" else logprobs, base, index, coef, T)
                if i:
                    times[way].append(time.perf_counter() - t)
        same = all(torch.equal(a, b) for a, b in zip(outs["before"], outs["after"]))
        b, a = (statistics.median(times[w]) * 1e3 for w in ("before", "after"))
        rows.append(f"| {N} x {L} x {V} | {str(dtype).removeprefix('torch.')} | {T} | {b:.1f} | {a:.1f} | {a / b:.3f} | {same} |")
        print(rows[-1], flush=True)
    return rows


def micro_batches(before, configs: list[str], reps: int) -> list[str]:
    """Table rows: each config's first training micro-batch (forward + backward) with each way's autograd node."""
    from _floor_step import first_micro_batch, floor_step

    rows, after_node = [], logprobs._TokenLogProbs
    for name in configs:
        trainer = floor_step(name, extra=["optim.skip_zero_advantage=false"], steps=2).trainer
        mb = first_micro_batch(trainer)
        assert mb is not None, f"config {name}: its step trained no rows"
        times: dict[str, list[float]] = {"before": [], "after": []}
        for i in range(reps + 1):
            for way in ("before", "after") if i % 2 == 0 else ("after", "before"):
                logprobs._TokenLogProbs = before._TokenLogProbs if way == "before" else after_node
                t = time.perf_counter()
                mb.run()
                if i:
                    times[way].append(time.perf_counter() - t)
        logprobs._TokenLogProbs = after_node
        b, a = (statistics.median(times[w]) for w in ("before", "after"))
        fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
        rows.append(f"| {name} | {trainer.precision.name} | {fmt(times['before'])} | {fmt(times['after'])} | {a / b:.3f} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    import floor

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the git ref whose algo/logprobs.py is 'before'")
    ap.add_argument("--configs", default="V", help="bench/floor.py configs whose micro-batch to time, comma-separated ('' for none)")
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=JSON", help="a config of your own (bench/floor.py --shape)")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    for shape in args.shape:
        floor.add_shape(shape)
    before = module_at(args.before)
    lines = result_head(
        f"algo.token_logprobs at {args.before} against this tree's",
        f"python bench/logprobs_copies_ab.py {shlex.join(sys.argv[1:])}",
        f"one process, 2 threads, {args.reps} timed runs per way after one warm-up, alternating which goes first.",
        ["rows x tokens x V", "logits", "temperature", "before ms", "after ms", "after / before", "same bits"],
    )
    lines += ops_alone(before, args.reps)
    configs = [c for c in args.configs.split(",") if c]
    if configs:
        lines += ["", "Training micro-batch (forward + backward, seconds per run), each way's token_logprobs node in place:", ""]
        lines += ["| config | precision | before s | after s | after / before (medians) |", "| --- | --- | --- | --- | --- |"]
        lines += micro_batches(before, configs, args.reps)
    if args.out:
        Path(args.out).write_text("\n".join([*lines, ""]))


if __name__ == "__main__":
    main()
