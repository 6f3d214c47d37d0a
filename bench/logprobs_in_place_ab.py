"""One training micro-batch of a floor config with the log-probs' backward as before (the logits' gradient in a new
[N, L', V] tensor, p as exp((x - m) - log Z)) against the gradient written over the logits (rlvr.algo.logprobs.
GRAD_IN_LOGITS: the training forward's logits are read by nothing else), and against that with p as the forward's
e = exp(x - m) over Z (E_OVER_Z: one pass fewer per chunk), in one process: one Trainer on a bench/floor.py config,
two training steps, then its first micro-batch's forward and backward `--reps` times per way, alternating the order.
Each run starts from zeroed gradients; the table gives whether "over the logits" left the same gradients as "before",
bit for bit, and the largest gap of "e over Z"'s from them relative to the largest gradient entry of that tensor.

    cd bench && python logprobs_in_place_ab.py V --reps 6 --out results/logprobs_in_place_intel.md && cd ..
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rlvr.algo.logprobs as logprobs  # noqa: E402
from _floor_step import micro_batch_ab, relative_gap, same_gradients  # noqa: E402
from _report import emit, result_head, table_row  # noqa: E402

WAYS = {"before": (False, False), "over the logits": (True, False), "and e over Z": (True, True)}


def _switch(grad_in_logits: bool, e_over_z: bool):
    def on() -> None:
        logprobs.GRAD_IN_LOGITS, logprobs.E_OVER_Z = grad_in_logits, e_over_z

    return on


def measure(name: str, reps: int) -> tuple[dict[str, list[float]], dict[str, list], str]:
    """(seconds per way, gradients per way, what ran) for config `name`."""
    trainer, mb, seconds, grads = micro_batch_ab(name, {w: _switch(*f) for w, f in WAYS.items()}, reps)
    logprobs.GRAD_IN_LOGITS, logprobs.E_OVER_Z = True, True
    e = mb.inputs.episodes
    rows = len(range(*mb.rows.indices(e.completion_ids.shape[0])))
    vocab = trainer.train_model.get_output_embeddings().weight.shape[0]
    return seconds, grads, f"{rows} rows x {e.completion_ids.shape[1]} tokens, vocabulary {vocab}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["V"])
    ap.add_argument("--shape", action="append", default=[], help="NAME=JSON, as bench/floor.py's --shape")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import floor

    for shape in args.shape:
        floor.add_shape(shape)
    lines = result_head(
        "A training micro-batch: the log-probs' backward into a new tensor vs over the logits (and p as e over Z)",
        f"cd bench && python logprobs_in_place_ab.py {' '.join(sys.argv[1:])}",
        f"one process per config; the same micro-batch {args.reps} times per way, alternating which goes first",
        ["config", "micro-batch", *(f"{w} s" for w in WAYS), "over the logits / before", "and e over Z / before",
         "over the logits: same gradients", "e over Z: largest relative gap"],
    )  # fmt: skip
    for name in args.configs:
        seconds, grads, what = measure(name, args.reps)
        m = {w: statistics.median(seconds[w]) for w in WAYS}
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in WAYS]
        ratios = [f"{m[w] / m['before']:.3f}" for w in ("over the logits", "and e over Z")]
        same = same_gradients(grads["before"], grads["over the logits"])
        gap = relative_gap(grads["before"], grads["and e over Z"])
        lines.append(table_row(name, what, *runs, *ratios, same, f"{gap:.1e}"))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
