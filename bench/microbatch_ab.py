"""One training micro-batch of a floor config, timed under rlvr overrides A and B, each in its own process.

    python bench/microbatch_ab.py F "" "optim.compile=on" --rounds 2 --reps 5 --out bench/results/x.md

A worker builds bench/floor.py's config (its model, prompts and settings, plus the overrides), runs two training
steps (anything that compiles does so there), keeps the last step's first micro-batch, then times its forward and
backward (`Updater.micro_batch_step`, the optimizer step left out) `--reps` times and reports the median. The ways
alternate process by process for `--rounds` rounds, so the machine's drift falls on both; the report gives each
round's medians and the median of them, with the rows, tokens and and the training plan's micro-batch
line (its fast paths) for each way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def worker(name: str, overrides: list[str], reps: int) -> dict:
    from _floor_step import first_micro_batch, floor_step

    trainer = floor_step(name, extra=overrides, steps=2).trainer  # anything that compiles does so in these steps
    mb = first_micro_batch(trainer)
    if mb is None:
        raise SystemExit(f"config {name}: its step trained no rows (every group's rewards equal): no micro-batch to time")
    seconds = []
    for _ in range(reps + 1):  # the first: anything still cold
        t = time.perf_counter()
        mb.run()
        seconds.append(time.perf_counter() - t)
    e = mb.inputs.episodes
    return dict(
        seconds=statistics.median(seconds[1:]),
        rows=len(range(*mb.rows.indices(e.completion_ids.shape[0]))),
        completion_tokens=int(e.attention_mask[mb.rows].sum()),
        plan=next(line for line in trainer.plan.describe().splitlines() if "micro-batch" in line).strip(),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config", help="a bench/floor.py config (A-K)")
    ap.add_argument("a", help="rlvr overrides of way A, comma-separated ('' for none)")
    ap.add_argument("b", help="rlvr overrides of way B")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", help="markdown report (printed too)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    ways = {"A": [x for x in a.a.split(",") if x], "B": [x for x in a.b.split(",") if x]}
    if a.worker:
        print("RESULT " + json.dumps(worker(a.config, ways[a.worker], a.reps)))
        return
    from _report import cpu_name, table_row

    results: dict[str, list[dict]] = {w: [] for w in ways}
    for i in range(a.rounds):
        for w in ways if i % 2 == 0 else list(ways)[::-1]:
            cmd = [sys.executable, __file__, a.config, a.a, a.b, "--reps", str(a.reps), "--worker", w]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            results[w].append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
    out = f" --out {a.out}" if a.out else ""
    lines = [
        f"# One training micro-batch of config {a.config}: A = [{a.a}] vs B = [{a.b}]",
        "",
        f'Command: `python bench/microbatch_ab.py {a.config} "{a.a}" "{a.b}" --rounds {a.rounds} --reps {a.reps}{out}` '
        f"({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, 2 threads; ways alternate process by process; medians of {a.reps} forward+backward passes.",
        "",
        "| way | overrides | rows | completion tokens | s per round | median s | vs A | the training plan's line |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = statistics.median(r["seconds"] for r in results["A"])
    for w, overrides in ways.items():
        rs = results[w]
        med = statistics.median(r["seconds"] for r in rs)
        per_round = ", ".join(f"{r['seconds']:.3f}" for r in rs)
        first = rs[0]
        cells = [w, " ".join(overrides) or "none", first["rows"], first["completion_tokens"], per_round, f"{med:.3f}", f"{med / base:.2f}x"]
        lines.append(table_row(*cells, first["plan"]))
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
