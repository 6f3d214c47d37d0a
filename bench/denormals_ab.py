"""One training micro-batch of a floor config with subnormal floats as the CPU takes them against flushed to zero in
the thread and its OpenMP team (rlvr.models.denormals.flushing_denormals, what the trainer's update runs inside with
flush_denormals, the default), in one process: one Trainer on a bench/floor.py config, two training steps, then its
first micro-batch's forward and backward `--reps` times per way, alternating the order. Each run starts from no
gradients; the table gives whether the two ways left the same gradients bit for bit, else the largest gap relative
to the largest entry of that gradient, and how many of the logits' gradient entries are subnormal as the CPU takes
them (the values the lm_head's backward products read).

    cd bench && python denormals_ab.py S1 --shape 'S1={...}' --reps 3 --out results/denormals_intel.md && cd ..
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from _floor_step import micro_batch_ab, relative_gap, same_gradients  # noqa: E402
from _report import emit, result_head, table_row  # noqa: E402
from rlvr.models.denormals import flushing_denormals  # noqa: E402

WAYS = ("as the CPU takes them", "flushed")


def measure(name: str, reps: int) -> tuple[dict[str, list[float]], dict[str, list], str, float]:
    """(seconds per way, gradients per way, what ran, the share of the logits' gradient entries that are subnormal)."""
    scope = contextlib.ExitStack()

    def flushed() -> None:
        scope.close()
        scope.enter_context(flushing_denormals())

    trainer, mb, seconds, grads = micro_batch_ab(name, {WAYS[0]: scope.close, WAYS[1]: flushed}, reps)
    scope.close()
    head = trainer.train_model.get_output_embeddings()
    caught: list[float] = []
    hook = head.register_full_backward_hook(lambda m, gin, gout: caught.append(_subnormal_share(gout[0])))
    for p in trainer.train_model.parameters():
        p.grad = None
    mb.run()
    hook.remove()
    e = mb.inputs.episodes
    rows = len(range(*mb.rows.indices(e.completion_ids.shape[0])))
    what = f"{rows} rows x {e.completion_ids.shape[1]} tokens, vocabulary {head.weight.shape[0]}, hidden {head.weight.shape[1]}"
    return seconds, grads, what, caught[0] if caught else float("nan")


def _subnormal_share(g: torch.Tensor) -> float:
    tiny = torch.finfo(torch.float32).tiny
    return float(((g.abs() < tiny) & (g != 0)).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["V"])
    ap.add_argument("--shape", action="append", default=[], help="NAME=JSON, as bench/floor.py's --shape")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import floor

    for shape in args.shape:
        floor.add_shape(shape)
    lines = result_head(
        "A training micro-batch: subnormal floats as the CPU takes them vs flushed to zero (FTZ/DAZ) in every thread",
        f"cd bench && python denormals_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config; the same micro-batch {args.reps} times per way, alternating which goes first",
        ["config", "micro-batch", *(f"{w} s" for w in WAYS), "flushed / as taken (medians)", "subnormal share of the logits' gradient",
         "gradients: same bits, or largest relative gap"],
    )  # fmt: skip
    for name in args.configs:
        seconds, grads, what, share = measure(name, args.reps)
        m = {w: statistics.median(seconds[w]) for w in WAYS}
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        same = same_gradients(grads[WAYS[0]], grads[WAYS[1]])
        gap = "same" if same else f"{relative_gap(grads[WAYS[0]], grads[WAYS[1]]):.1e}"
        lines.append(table_row(name, what, *runs, f"{m[WAYS[1]] / m[WAYS[0]]:.3f}", f"{share:.1e}", gap))
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
