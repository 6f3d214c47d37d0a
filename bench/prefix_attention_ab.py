"""The training forward's attention over a group's shared prompt (rlvr.models.prefix_attention) three ways: repeated
for each row (the way before the grouped products), grouped in one block per layer (the way before the blocks), and
grouped in blocks of prefix_attention.BLOCK_BYTES scores (now). One process per way and round, the order alternating
by round (inside one process, alternating ways' allocations slowed whichever ran second: norm_rotary_intel.md): each
builds a Trainer on a bench/floor.py config, runs one step, then times that step's first micro-batch (forward +
backward, no optimizer step) `--reps` times, and once more under a dispatch-mode timer that sums the wall time of the
attention's own ops (batched products, softmax and its backward, SDPA's kernels: CPU ops run synchronously, so this
counts cache misses where torch.profiler's page faults would distort them). Each worker also compares its gradients
with the repeated prompt's (the same math: equal up to float rounding).

    python bench/prefix_attention_ab.py --configs C,F,K --shape K=JSON --rounds 3 --reps 4 --out bench/results/prefix_blocks_intel.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
WAYS = ("repeated", "one block", "blocks")
ATTENTION_OPS = ("bmm", "baddbmm", "_softmax", "_softmax_backward_data", "_scaled_dot_product_flash_attention_for_cpu")


def attention_op_seconds(fn) -> float:
    """Wall time of the attention's own ops (ATTENTION_OPS and their backwards) in one call of fn."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Timer(TorchDispatchMode):
        seconds = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            t = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__.rstrip("_").removesuffix("_backward") in ATTENTION_OPS:
                Timer.seconds += time.perf_counter() - t
            return out

    with Timer(), torch.no_grad() if not torch.is_grad_enabled() else torch.enable_grad():
        fn()
    return Timer.seconds


def worker(name: str, way: str, reps: int, shapes: list[str]) -> dict:
    import torch

    sys.path.insert(0, str(HERE))
    import compare_trl
    import floor

    import rlvr.models.forward as forward
    import rlvr.models.prefix_attention as prefix_attention
    from rlvr.config import load_config
    from rlvr.training import Trainer
    from rlvr.training.minibatches import this_ranks_minibatches
    from rlvr.training.update_inputs import FirstEpoch
    from rlvr.training.update_metrics import MetricSums

    for shape in shapes:
        floor.add_shape(shape)
    grouped = forward._completions_over_grouped_prefix
    torch.set_num_threads(2)
    spec = {
        **floor.make_spec(name, floor.build_inputs([name]), types.SimpleNamespace(threads=2, warmup=1, steps=3)),
        "out": tempfile.mkdtemp(),
    }
    trainer = Trainer(load_config(None, compare_trl.rlvr_overrides(spec)), logger_live=False)
    trainer.train_step()
    record, updater = trainer.last_step, trainer.updater
    minibatches = this_ranks_minibatches(record.batch, record.advantages, trainer.cfg.optim.steps_per_generation, trainer.dist)
    inputs = updater.prepare(minibatches[0])
    micro_batch = inputs.micro_batches[0]
    params = [p for p in trainer.policy.model.parameters() if p.requires_grad]

    def one(how: str) -> list[torch.Tensor]:
        forward._completions_over_grouped_prefix = (lambda *a: None) if how == "repeated" else grouped  # None: repeated
        prefix_attention.BLOCK_BYTES = 2**62 if how == "one block" else BLOCK_BYTES
        trainer.optimizer.zero_grad(set_to_none=True)
        updater.micro_batch_step(inputs, micro_batch, FirstEpoch(), MetricSums(trainer.device), last=True)
        return [p.grad.detach().clone() for p in params]

    BLOCK_BYTES = prefix_attention.BLOCK_BYTES
    seconds = []
    for i in range(reps + 1):  # the first warms up
        t = time.perf_counter()
        grads = one(way)
        if i:
            seconds.append(time.perf_counter() - t)
    attention = attention_op_seconds(lambda: one(way))
    want = one("repeated")
    diff = max(float((g - h).abs().max()) for g, h in zip(grads, want)) / max(float(g.abs().max()) for g in want)
    rows = micro_batch.rows.stop - micro_batch.rows.start
    return dict(rows=rows, precision=trainer.precision.describe(), seconds=seconds, attention=attention, grad_diff=diff)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="C,F,K")
    ap.add_argument("--shape", action="append", default=[], help="NAME=JSON as bench/floor.py's --shape")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--out", default="bench/results/prefix_blocks.md")
    ap.add_argument("--worker", nargs=2, metavar=("CONFIG", "WAY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(*args.worker, args.reps, args.shape)))
        return
    sys.path.insert(0, str(HERE))
    import torch
    from _report import cpu_name

    lines = [
        "# Training attention over a shared prompt: repeated per row, grouped in one block per layer, grouped in blocks",
        "",
        f"Command: `python bench/prefix_attention_ab.py {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, torch {torch.__version__}, 2 threads. One process per way and round ({args.rounds} rounds,",
        f"order alternating), each timing the first micro-batch of the config's first step, forward + backward, {args.reps}",
        "times after one warm-up; per round its median, and the attention ops' time in one more run (module docstring);",
        "the ratios are medians over rounds of the way's time over the other's in the same round.",
        "",
        "| config | rows | way | micro-batch s (per round) | attention ops s (per round) | / repeated | / one block | grad diff / max |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in args.configs.split(","):
        got: dict[str, list[dict]] = {w: [] for w in WAYS}
        for r in range(args.rounds):
            for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                cmd = [sys.executable, __file__, "--worker", name, way, "--reps", str(args.reps)] + [f"--shape={s}" for s in args.shape]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                got[way].append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
                print(name, way, round(statistics.median(got[way][-1]["seconds"]), 3), round(got[way][-1]["attention"], 3), flush=True)
        med = {w: [statistics.median(x["seconds"]) for x in got[w]] for w in WAYS}
        for way in WAYS:
            runs = got[way]
            ratio = {base: statistics.median(a / b for a, b in zip(med[way], med[base])) for base in ("repeated", "one block")}
            attention = " / ".join(f"{x['attention']:.3f}" for x in runs)
            lines.append(
                f"| {name} | {runs[0]['rows']} | {way} | {' / '.join(f'{t:.3f}' for t in med[way])} | {attention} | "
                f"{ratio['repeated']:.3f} | {ratio['one block']:.3f} | {max(x['grad_diff'] for x in runs):.1e} |"
            )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
