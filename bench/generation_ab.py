"""Generation A/Bs inside one process, for settings a config cannot switch (bench/packing_ab.py,
bench/decode_attention_ab.py, bench/decode_attention_choice_ab.py): one Trainer on a bench/floor.py config, one
training step, then that step's generation (the same prompts, sampling and seeds) again under each way in turn,
alternating the order every repetition, so a burst of other work on the machine hits the ways alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path


from _floor_step import floor_step
from rlvr.training import Trainer


def generation_ab(
    name: str, ways: dict[str, Callable[[], None]], reps: int, extra: list[str] | tuple[str, ...] = ()
) -> tuple[Trainer, dict[str, list], dict[str, list[float]]]:
    """(the trainer, each way's generations, each way's seconds): `ways` maps a name to what switches that way on;
    `extra`: rlvr overrides of the config."""
    step = floor_step(name, extra=extra)
    trainer = step.trainer
    outputs: dict[str, list] = {w: [] for w in ways}
    seconds: dict[str, list[float]] = {w: [] for w in ways}
    for i in range(reps):
        for way in list(ways) if i % 2 == 0 else list(ways)[::-1]:
            ways[way]()
            t = time.perf_counter()
            outputs[way].append(step.generate())
            seconds[way].append(time.perf_counter() - t)
    print(f"config {name}, {trainer.precision.describe()}")
    for way, ts in seconds.items():
        print(f"{way}: generation min {min(ts):.3f} s, median {statistics.median(ts):.3f} s, {[round(t, 3) for t in ts]}", flush=True)
    return trainer, outputs, seconds


def bit_for_bit_table(
    title: str, command: str, ways: dict[str, Callable[[], None]], configs: list[str], reps: int, out: str | None
) -> None:
    """generation_ab of two ways that must generate the same tokens and log-probs, for each config: one table row each
    (their seconds, the second's median over the first's, and whether every run was the same), printed as it comes and
    written under result_head to `out` when given."""
    import torch

    from _report import result_head

    first, second = ways
    lines = result_head(
        title,
        command,
        f"one process per config, the same generation {reps} times per way, alternating which goes first.",
        ["config", "precision", f"{first} s", f"{second} s", f"{second} / {first} (medians)", "same tokens and log-probs"],
    )
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    for name in configs:
        trainer, outputs, seconds = generation_ab(name, ways, reps)
        same = all(
            torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.sampling_logprobs, b.sampling_logprobs)
            for a, b in zip(outputs[first], outputs[second])
        )
        ratio = statistics.median(seconds[second]) / statistics.median(seconds[first])
        lines.append(f"| {name} | {trainer.precision.name} | {fmt(seconds[first])} | {fmt(seconds[second])} | {ratio:.3f} | {same} |")
        print(lines[-1], flush=True)
    if out:
        Path(out).write_text("\n".join([*lines, ""]))


def closeness_table(
    title: str, command: str, ways: dict[str, Callable[[], None]], configs: list[str], reps: int, out: str | None, ratio: str
) -> None:
    """generation_ab of two ways that must generate the same tokens, their log-probs perhaps rounding apart, for each
    config: one table row each (their seconds, the second's median over the first's under the header `ratio`, whether
    every run drew the same tokens and the largest log-prob gap), written under result_head to `out` (printed without)."""
    import torch

    from _report import emit, result_head, table_row

    lines = result_head(
        title,
        command,
        f"one process per config; the same generation {reps} times per way, alternating which goes first",
        ["config", *(f"{w} s" for w in ways), ratio, "same tokens", "largest log-prob gap"],
    )
    for name in configs:
        _, outputs, seconds = generation_ab(name, ways, reps)
        a, b = outputs.values()
        same = all(torch.equal(x.completion_ids, y.completion_ids) for x, y in zip(a, b))
        gap = max(float((x.sampling_logprobs - y.sampling_logprobs).abs().max()) for x, y in zip(a, b)) if same else float("nan")
        runs = [", ".join(f"{s:.3f}" for s in seconds[w]) for w in ways]
        m = [statistics.median(seconds[w]) for w in ways]
        lines.append(table_row(name, *runs, f"{m[1] / m[0]:.3f}", same, f"{gap:.1e}"))
    emit(lines, out)


def closeness_cli(
    doc: str, script: str, ways: dict[str, Callable[[], None]], title: str, ratio: str, configs=("H",), reps: int = 12
) -> None:
    """The command line of an A/B script whose two ways must draw the same tokens (closeness_table): configs, --reps,
    --out; `script` its file name, for the command recorded with the table."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=list(configs))
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    command = f"cd bench && python {script} {' '.join(sys.argv[1:])}"
    closeness_table(title, command, ways, args.configs, args.reps, args.out, ratio)
