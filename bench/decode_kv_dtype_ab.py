"""The lean decode's KV buffers under bf16 autocast: in fp32 always (before) against the way this machine's timing
chooses at the decode's shapes (decode_attention.decode_attention_way: bf16 buffers where their attention took at most
LOWER_AT_MOST of the fp32 buffers' time), whole generations in one process, alternating:

    python bench/decode_kv_dtype_ab.py C 10     # from bench/; config C, 10 generations per way

Prints each way's times (bench/generation_ab.py), the way chosen, how many rows drew the same tokens, and the largest
log-prob difference over the tokens before a row's first different one (bf16 rounds the keys and the scores).
"""

from __future__ import annotations

import sys

import rlvr.rollout.engines.hf.decode_attention as da
import rlvr.rollout.engines.hf.lean_decode as ld
from generation_ab import generation_ab

if __name__ == "__main__":
    name, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6
    measured = ld.decode_attention_way
    ways = {
        "fp32": lambda: setattr(ld, "decode_attention_way", lambda *a, **kw: measured(*a, **{**kw, "lower": None})),
        "measured": lambda: setattr(ld, "decode_attention_way", measured),
    }
    _, outputs, _ = generation_ab(name, ways, reps)
    for key, way in da._CHOICES.items():
        print("way chosen:", key, way)
    a, b = outputs["fp32"][0], outputs["measured"][0]
    same = (a.completion_ids == b.completion_ids).all(-1)
    before_first = ((a.completion_ids != b.completion_ids).cumsum(-1) == 0) & a.completion_mask.bool() & b.completion_mask.bool()
    diff = (a.sampling_logprobs - b.sampling_logprobs)[before_first].abs().max()
    print(f"the same tokens in {int(same.sum())} of {same.numel()} rows")
    print(f"max |d logp| over the tokens before a row's first different one: {float(diff):.2e}")
