"""torch's CPU softmax over a short last dim against the same scores padded with -inf to
decode_attention.SOFTMAX_MIN_KEYS keys (what decode_attention._softmax does below that many), per call, 2 threads:

    python bench/softmax_short.py

Shapes: [8, 4, rows, keys] fp32, the prompt part of the episode attention (8 prompts, 4 kv heads, the G x rep x K
query rows of a group against a prompt of `keys` tokens) and one over 16 keys for comparison.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from _report import cpu_name  # noqa: E402

from rlvr.rollout.engines.hf.decode_attention import _softmax  # noqa: E402


def per_call(f, reps: int = 300) -> float:
    for _ in range(30):
        f()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t) / reps


def main() -> None:
    torch.set_num_threads(2)
    print(f"{cpu_name()}, torch {torch.__version__}, 2 threads, fp32\n")
    print("| scores | torch.softmax us | padded (_softmax) us | ratio |\n| --- | --- | --- | --- |")
    for rows, keys in [(8, 8), (8, 15), (192, 8), (192, 12), (2048, 4), (2048, 8), (8, 16), (192, 16)]:
        s = torch.randn(8, 4, rows, keys)
        torch.testing.assert_close(_softmax(s), torch.softmax(s, -1), rtol=0, atol=1e-6)
        plain, padded = per_call(lambda s=s: torch.softmax(s, -1)), per_call(lambda s=s: _softmax(s))
        print(f"| [8, 4, {rows}, {keys}] | {plain * 1e6:.1f} | {padded * 1e6:.1f} | {padded / plain:.2f} |")


if __name__ == "__main__":
    main()
