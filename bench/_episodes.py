"""The multi-turn episode A/Bs' shared parts (episodes_whole_ab.py, episodes_chunks_ab.py, episode_attention_ab.py,
episodes_kv_dtype_ab.py): their questions, a driver answering with tool-result-like text, and the loop that times
whole batches of episodes each way in turn, alternating the order every repetition so that a burst of other work on
the machine hits the ways alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

QUESTIONS = ("12+34=", "5-3=", "87+9=", "1+1=", "99-98=", "7*6=", "3+3=", "10-1=")


class Answering:
    """A turn driver: a turn ends at a stop string and is answered with a tool-result-like text of 20-30 tokens
    (bench/floor.py's config H answers with about 24), `turns` times."""

    def __init__(self, tokenizer, turns: int = 5, stop_strings: tuple[str, ...] = ("5", "9")):
        self.tokenizer, self.turns, self.count, self.pending = tokenizer, turns, {}, {}
        self.stop_strings = list(stop_strings)

    def end_turn(self, row, turn_ids, eos):
        n = self.count[row] = self.count.get(row, 0) + 1
        if eos or n > self.turns:
            return False
        text = f"<result>{row * 7 % 100} is too {'low' if row % 2 else 'high'}{'!' * (row % 5)}</result>"
        self.pending[row] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return True

    def ready(self, block):
        out, self.pending = self.pending, {}
        return out


def alternate(ways: dict, run: Callable[[], list], reps: int = 7) -> tuple[dict, dict]:
    """(each way's seconds per batch, each way's last batch): for each repetition, every way switched on in turn
    (ways[name]()) and one batch run() timed."""
    seconds: dict = {w: [] for w in ways}
    batches: dict = {}
    for i in range(reps):
        for way in list(ways) if i % 2 == 0 else list(ways)[::-1]:
            ways[way]()
            t = time.perf_counter()
            batches[way] = run()
            seconds[way].append(time.perf_counter() - t)
    return seconds, batches


def report(seconds: dict) -> None:
    """Each way's median and minimum, the first batch (a warm-up) left out, then every time; with two ways also the
    median of their ratio within each repetition (the two batches run back to back: robust to the machine's drift)."""
    for way, ts in seconds.items():
        print(f"{way}: median {statistics.median(ts[1:]):.3f} s, min {min(ts[1:]):.3f} s, {[round(t, 3) for t in ts]}")
    if len(seconds) == 2:
        (a, ta), (b, tb) = seconds.items()
        ratios = [y / x for x, y in zip(ta[1:], tb[1:])]
        print(f"{b} / {a} within each repetition: median {statistics.median(ratios):.3f}, {[round(r, 3) for r in ratios]}")
