"""Generation with the decode attention as this machine's timing chooses it (decode_attention.decode_attention_way)
against the explicit products always (in the buffers' dtype the step asks for; the shared layout wherever either may
run) and against the timed choice without the repeated layout's flash kernel (timed since the repeated layout may run
it), in one process, alternating:

    RLVR_PRECISION_CACHE=/tmp/pc/precision.json python bench/decode_attention_choice_ab.py F 4   # from bench/
"""

import functools
import statistics
import sys

import rlvr.rollout.engines.hf.decode_attention as da
import rlvr.rollout.engines.hf.lean_decode as ld
from generation_ab import generation_ab


def main() -> None:
    name, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
    measured = ld.decode_attention_way
    ways = {
        "explicit": lambda: setattr(ld, "decode_attention_way", lambda *a, **kw: da.AttentionWay(a[7], False, kw["shared"] is not False)),
        "measured": lambda: setattr(ld, "decode_attention_way", measured),
        "measured, repeated explicit": lambda: setattr(ld, "decode_attention_way", functools.partial(measured, repeated_flash=False)),
    }
    _, outputs, seconds = generation_ab(name, ways, reps)
    base = statistics.median(seconds["measured, repeated explicit"])
    print(name, "medians over 'measured, repeated explicit':", {w: round(statistics.median(s) / base, 3) for w, s in seconds.items()})
    same = all(a.completion_ids.equal(b.completion_ids) for a, b in zip(outputs["measured"], outputs["measured, repeated explicit"]))
    print(name, "the same tokens, measured vs measured with the repeated layout explicit:", same)
    print(name, "choices", da._CHOICES)


if __name__ == "__main__":
    main()
