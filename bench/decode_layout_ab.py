"""The lean decode's KV layout for prompts of SHARED_PREFIX_MIN_PROMPT to SHARED_PREFIX_TIMED_MAX tokens: the prompt's
keys/values kept once per group always (before) against the layout this machine's timing chooses at the decode's
shapes (decode_attention.decode_attention_way with shared=None: repeated or shared, fp32 or, under bf16 autocast, bf16
buffers), whole generations in one process, alternating:

    cd bench && python decode_layout_ab.py F 8 data.path=/tmp/rlvr_bench/prompts_mid.jsonl   # ~75-token prompts

Arguments after the repetitions are rlvr overrides (e.g. another prompt file). Prints each way's times
(bench/generation_ab.py), the ways chosen, the prompt length, and how many rows drew the same tokens.
"""

from __future__ import annotations

import sys

import rlvr.rollout.engines.hf.decode_attention as da
import rlvr.rollout.engines.hf.lean_decode as ld
from generation_ab import generation_ab

if __name__ == "__main__":
    name, reps, extra = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6, sys.argv[3:]
    measured = ld.decode_attention_way
    shared_always = lambda *a, **kw: measured(*a, **{**kw, "shared": True if kw["shared"] is None else kw["shared"]})  # noqa: E731
    ways = {
        "shared": lambda: setattr(ld, "decode_attention_way", shared_always),
        "measured": lambda: setattr(ld, "decode_attention_way", measured),
    }
    _, outputs, _ = generation_ab(name, ways, reps, extra=extra)
    for key, way in da._CHOICES.items():
        print("way chosen:", key, way)
    a, b = outputs["shared"][0], outputs["measured"][0]
    print(f"prompt length {a.prompt_ids.shape[1]}")
    same = (a.completion_ids == b.completion_ids).all(-1)
    print(f"the same tokens in {int(same.sum())} of {same.numel()} rows")
