"""What the SmolLM2 benches (smollm2.py, smollm2_tools.py, code.py) share when they write their result:
a 95 % Wilson interval, the reward-curve PNG and the cells of the markdown tables."""

from __future__ import annotations

import math
from pathlib import Path


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (95 % for z = 1.96)."""
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def reward_curve(png: Path, metrics: list[dict], series: list[tuple[str, str]], *, ylabel: str | None = None) -> None:
    """One line per (metrics.jsonl key, label) over the steps, saved to `png`; a step without the key is a gap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    steps = [m["step"] for m in metrics]
    for key, label in series:
        ax.plot(steps, [m.get(key, float("nan")) for m in metrics], label=label, alpha=0.8)
    ax.set_xlabel("step")
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def with_ci(result: dict, key: str) -> str:
    """`0.412 [0.351, 0.476]`: result[key] and its interval result[key + "_ci"]."""
    lo, hi = result[key + "_ci"]
    return f"{result[key]:.3f} [{lo:.3f}, {hi:.3f}]"


def table_row(*cells) -> str:
    """A markdown table row: `| a | b | c |`."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def cpu_name() -> str:
    """The CPU for the machine line of a result: its model name (the architecture where it is not known), with its
    family-model-stepping numbers and the vector features that decide fp32/bf16 speed, since a cloud CPU's generic
    name ("Intel(R) Xeon(R) Processor") covers generations with and without fast bf16."""
    import platform

    from rlvr.models.machine_cache import cpu_fields

    fields = cpu_fields()
    name = fields.get("model name") or platform.machine()
    if "cpu family" not in fields:
        return name
    flags = set(fields.get("flags", "").split())
    features = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name} ({fields['cpu family']}-{fields.get('model', '?')}-{fields.get('stepping', '?')}; {' '.join(features) or 'no avx2'})"


def result_head(title: str, command: str, setup: str, columns: list[str]) -> list[str]:
    """The opening lines of a bench's results file: its title, the command with the time it ran, the machine (CPU,
    torch, threads) with the run's `setup`, and the header of its table with `columns`."""
    import time

    import torch

    return [
        f"# {title}",
        "",
        f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M')})  ",
        f"Machine: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads; {setup}",
        "",
        table_row(*columns),
        table_row(*["---"] * len(columns)),
    ]


def emit(lines: list[str], out: str | None) -> None:
    """A results file's lines printed, and written to `out` when given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)
