"""The lean decode's KV buffers read whole (grown GROW slots at a time, unwritten slots masked) against buffers of
every slot read up to the slot written (a slice of each row's buffer), whole generations in one process:

    python bench/decode_whole_ab.py B 8     # config B, 8 generations per way, alternating

rlvr.rollout.engines.hf.kv_buffers.GROW = 0 is the sliced way. Prints each way's times (bench/generation_ab.py)
and how many rows drew the same tokens (the two ways sum the same products in another order: a rounding apart).
"""

from __future__ import annotations

import sys

from rlvr.rollout.engines.hf import kv_buffers
from generation_ab import generation_ab

if __name__ == "__main__":
    name, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6
    grow = kv_buffers.GROW
    ways = {"sliced": lambda: setattr(kv_buffers, "GROW", 0), "whole": lambda: setattr(kv_buffers, "GROW", grow)}
    _, outputs, _ = generation_ab(name, ways, reps)
    a, b = outputs["sliced"][0], outputs["whole"][0]
    same = (a.completion_ids == b.completion_ids).all(-1)
    print(f"the same tokens in {int(same.sum())} of {same.numel()} rows")
