"""Wall time per aten op of one generation and one training micro-batch of a floor config.

    python bench/op_times.py F B --top 25 --out bench/results/op_times_intel.md
    python bench/op_times.py K --shape 'K={"llama": {...}, "prompts": 4, ...}' --shapes

bench/floor.py's per-op profile uses torch.profiler, whose page faults inflate large fresh tensors 2-3x on some
machines. Here a TorchDispatchMode times each aten op as it runs (CPU ops are synchronous, so an op's wall time is
its cost), keyed by op (and with --shapes by its input shapes). The mode adds ~4 us per op, reported as the gap
between a plain and a timed run. The worker builds the config as bench/floor.py does, runs two training steps,
then times the last step's generation again (same prompts and seeds) and its first micro-batch's forward+backward.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import floor  # noqa: E402
from _floor_step import first_micro_batch, floor_step  # noqa: E402
from _report import cpu_name, table_row  # noqa: E402

# op name -> category, for the summary line (anything else: "elementwise and the rest")
CATEGORIES = {
    "products": {"mm", "addmm", "_linear_pointwise", "linear"},
    "attention": {"bmm", "baddbmm", "baddbmm_", "_softmax", "_softmax_backward_data", "logsumexp", "lerp", "sigmoid"}
    | {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"},
    "metadata (views)": {"view", "_unsafe_view", "t", "transpose", "expand", "slice", "select", "unsqueeze", "squeeze", "permute"}
    | {"detach", "as_strided", "alias", "lift_fresh"},
}


class OpTimer(TorchDispatchMode):
    """Wall seconds and calls per op (and input shapes with `shapes`)."""

    def __init__(self, shapes: bool):
        super().__init__()
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.shapes = shapes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        dt = time.perf_counter() - t
        key = func.overloadpacket.__name__
        if self.shapes:
            key += " " + str([tuple(a.shape) for a in args if isinstance(a, torch.Tensor)])
        self.seconds[key] += dt
        self.calls[key] += 1
        return out


def category(key: str) -> str:
    name = key.split()[0]
    return next((c for c, names in CATEGORIES.items() if name in names), "elementwise and the rest")


def measure(name: str, shapes: bool, reps: int) -> dict:
    """{phase: (plain seconds per run, timed OpTimer)} for generation and one training micro-batch."""
    step = floor_step(name, steps=2)
    runs = {"generation": step.generate}
    if (mb := first_micro_batch(step.trainer)) is not None:
        runs["training micro-batch"] = mb.run
    out = {}
    for phase, run in runs.items():
        run()
        plain = []
        for _ in range(reps):
            t = time.perf_counter()
            run()
            plain.append(time.perf_counter() - t)
        timer = OpTimer(shapes)
        with timer:
            run()
        out[phase] = (statistics.median(plain), timer)
    return out


def section(name: str, phase: str, plain: float, timer: OpTimer, top: int) -> list[str]:
    total = sum(timer.seconds.values())
    by_cat: dict[str, float] = defaultdict(float)
    for key, s in timer.seconds.items():
        by_cat[category(key)] += s
    lines = [
        f"### Config {name}: {phase}",
        "",
        f"Plain run (median): {plain * 1e3:.1f} ms. Timed run: {sum(timer.calls.values())} ops, {total * 1e3:.1f} ms inside them "
        f"(each op's time includes the timer's ~4 us).  ",
        "By category: " + ", ".join(f"{c} {s * 1e3:.1f} ms ({s / total:.0%})" for c, s in sorted(by_cat.items(), key=lambda kv: -kv[1])),
        "",
        "| op | calls | ms | share | us per call |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, s in sorted(timer.seconds.items(), key=lambda kv: -kv[1])[:top]:
        n = timer.calls[key]
        lines.append(table_row(f"`{key}`", n, f"{s * 1e3:.2f}", f"{s / total:.1%}", f"{s / n * 1e6:.1f}"))
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+", help="bench/floor.py configs (A-K, or one added with --shape)")
    ap.add_argument("--shape", action="append", default=[], help="NAME=JSON, as bench/floor.py's --shape")
    ap.add_argument("--shapes", action="store_true", help="key ops by their input shapes too")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--reps", type=int, default=3, help="plain runs per phase (the median is reported)")
    ap.add_argument("--out", help="markdown report (printed too)")
    a = ap.parse_args()
    for s in a.shape:
        floor.add_shape(s)
    flags = " ".join(["--shapes"] * a.shapes + [f"--top {a.top}", f"--reps {a.reps}"] + [f"--out {a.out}"] * bool(a.out))
    lines = [
        f"# Wall time per aten op, configs {', '.join(a.configs)}",
        "",
        f"Command: `python bench/op_times.py {' '.join(a.configs)}{' --shape ...' * bool(a.shape)} {flags}` "
        f"({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, 2 threads, torch {torch.__version__}.",
        "",
    ]
    for name in a.configs:
        for phase, (plain, timer) in measure(name, a.shapes, a.reps).items():
            lines += section(name, phase, plain, timer, a.top)
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
