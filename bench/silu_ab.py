"""The training forward's SiLU computed in place on a copy (rlvr.models.silu) against transformers' `silu(x)`.

Two parts: the op alone at activation shapes (out of place vs in place on a copy, forward and backward, alternating in
one process, the bits compared), then a bench/floor.py config's first training micro-batch (forward + backward, no
optimizer step) each way, one process per way and round, the order alternating by round (as bench/norm_rotary_ab.py:
alternating ways inside one process slows whichever allocates second).

    python bench/silu_ab.py --configs B,F,K --shape K=JSON --rounds 3 --reps 4 --out bench/results/silu_intel.md
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
OP_SHAPES = [(64, 1376), (256, 1376), (1024, 1376), (4096, 512), (4096, 1376), (19648, 1024)]


def worker(name: str, way: str, reps: int, shapes: list[str]) -> dict:
    sys.path.insert(0, str(HERE))
    import floor
    from _floor_step import first_micro_batch, floor_step

    import rlvr.models.forward as forward

    for shape in shapes:
        floor.add_shape(shape)
    if way == "before":
        forward.fast_silu = lambda model: contextlib.nullcontext()  # type: ignore[assignment]
    step = floor_step(name)
    trainer, mb = step.trainer, first_micro_batch(step.trainer)
    assert mb is not None, f"config {name}: its step trained no rows"
    times = []
    for i in range(reps + 1):  # the first warms up
        trainer.optimizer.zero_grad(set_to_none=True)
        t = time.perf_counter()
        mb.run()
        if i:
            times.append(time.perf_counter() - t)
    return {"training micro-batch": times}


def op_table() -> list[str]:
    import torch
    import torch.nn.functional as F

    from rlvr.models.machine_cache import fastest_times
    from rlvr.models.silu import _backward_in_place, _silu_in_place

    rows = ["| shape | silu(x) | silu_(x.clone()) | silu_backward | over a copy of g (ms) | same bits |", "|---|---|---|---|---|---|"]
    for shape in OP_SHAPES:
        x, g = torch.randn(*shape), torch.randn(*shape)
        ways = [
            lambda x=x: F.silu(x),
            lambda x=x: _silu_in_place(x),
            lambda x=x, g=g: torch.ops.aten.silu_backward(g, x),
            lambda x=x, g=g: _backward_in_place(g, x),
        ]
        t = fastest_times(ways, rounds=5)
        same = torch.equal(F.silu(x), _silu_in_place(x)) and torch.equal(torch.ops.aten.silu_backward(g, x), _backward_in_place(g, x))
        rows.append(f"| {list(shape)} | {t[0] * 1e3:.3f} | {t[1] * 1e3:.3f} | {t[2] * 1e3:.3f} | {t[3] * 1e3:.3f} | {same} |")
    return rows


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
    import torch
    from _report import cpu_name

    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ops = op_table()
    rows = []
    for name in filter(None, args.configs.split(",")):
        got: dict[str, list[float]] = {w: [] for w in WAYS}
        for r in range(args.rounds):
            for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                cmd = [sys.executable, __file__, "--worker", name, way, "--reps", str(args.reps)] + [f"--shape={s}" for s in args.shape]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
                got[way].append(statistics.median(result["training micro-batch"]))
                print(name, way, round(got[way][-1], 3), flush=True)
        b, a = got["before"], got["after"]
        ratio = statistics.median(x / y for x, y in zip(a, b))
        rows.append(f"| {name} | {' / '.join(f'{x:.3f}' for x in b)} | {' / '.join(f'{x:.3f}' for x in a)} | {ratio:.3f} |")
    header = "| config | before s (median per round) | after s | after / before (median of rounds) |"
    table = "\n".join([header, "| --- | --- | --- | --- |", *rows])
    command = "python bench/silu_ab.py " + " ".join(sys.argv[1:])
    text = (
        f"Command: `{command}` ({started})  \n"
        f"Machine: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, fp32.\n\n"
        "The op alone (best of 5 rounds):\n\n" + "\n".join(ops) + "\n\nA training micro-batch, forward + backward:\n\n" + table + "\n"
    )
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
