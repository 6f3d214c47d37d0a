"""RMSNorm and rotary embedding as one autograd node each in the training forward, and the decode's four-op rotation
(rlvr.models.norm_rotary), against transformers' own (the way before), one process per way and round.

Each worker builds a Trainer on a bench/floor.py config, runs one step, then times that step's first training
micro-batch (forward + backward, no optimizer step) and the step's generation again, `--reps` times each. Ways run
in separate processes, their order alternating by round: inside one process, alternating the two ways' allocations
slowed whichever ran second (bench/results/norm_rotary_intel.md), which a run never does.

    python bench/norm_rotary_ab.py --configs B,F,K --shape K=JSON --rounds 3 --reps 4 --out bench/results/norm_rotary_intel.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
WAYS = ("before", "after")


def _old_rotate(x, cos, sin):  # the decode's rotation before norm_rotary.rotate (transformers' own ops)
    import torch

    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def worker(name: str, way: str, reps: int, shapes: list[str]) -> dict:
    sys.path.insert(0, str(HERE))
    import floor
    from _floor_step import first_micro_batch, floor_step

    import rlvr.models.forward as forward
    import rlvr.rollout.engines.hf.lean_decode as lean_decode

    for shape in shapes:
        floor.add_shape(shape)
    if way == "before":
        forward.fused_norm_and_rotary = lambda model: contextlib.nullcontext()  # type: ignore[assignment]
        lean_decode.rotate, lean_decode.signed_sin = _old_rotate, lambda sin: sin  # type: ignore[assignment]
    step = floor_step(name)
    trainer, mb = step.trainer, first_micro_batch(step.trainer)
    assert mb is not None, f"config {name}: its step trained no rows"
    times: dict[str, list[float]] = {"training micro-batch": [], "generation": []}
    for i in range(reps + 1):  # the first of each warms up
        trainer.optimizer.zero_grad(set_to_none=True)
        t = time.perf_counter()
        mb.run()
        t1 = time.perf_counter()
        step.generate()
        if i:
            times["training micro-batch"].append(t1 - t)
            times["generation"].append(time.perf_counter() - t1)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="B,F")
    p.add_argument("--shape", action="append", default=[], help="NAME=JSON, as bench/floor.py's --shape")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--out", default=None)
    p.add_argument("--worker", nargs=2, metavar=("CONFIG", "WAY"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(*args.worker, args.reps, args.shape)))
        return
    sys.path.insert(0, str(HERE))
    from _report import cpu_name

    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    for name in args.configs.split(","):
        got: dict[str, dict[str, list[float]]] = {w: {} for w in WAYS}
        for r in range(args.rounds):
            for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                cmd = [sys.executable, __file__, "--worker", name, way, "--reps", str(args.reps)] + [f"--shape={s}" for s in args.shape]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
                for what, ts in result.items():
                    got[way].setdefault(what, []).append(statistics.median(ts))
                print(name, way, {k: round(v[-1], 3) for k, v in got[way].items()}, flush=True)
        for what in got["before"]:
            b, a = got["before"][what], got["after"][what]
            ratio = statistics.median(x / y for x, y in zip(a, b))
            rows.append(f"| {name} | {what} | {' / '.join(f'{x:.3f}' for x in b)} | {' / '.join(f'{x:.3f}' for x in a)} | {ratio:.3f} |")
    header = "| config | what | before s (median per round) | after s | after / before (median of rounds) |"
    table = "\n".join([header, "| --- | --- | --- | --- | --- |", *rows])
    command = "python bench/norm_rotary_ab.py " + " ".join(sys.argv[1:])
    text = f"Command: `{command}` ({started})  \nMachine: {cpu_name()}, 2 threads.\n\n{table}\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
