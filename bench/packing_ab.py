"""fp32 generation with every large weight packed (the rule before packing was measured per machine) against the
packing each weight shape measures faster on this machine (rlvr.models.packed_linears.fp32_packs), in one process.

    RLVR_PRECISION_CACHE=/tmp/pc/precision.json python bench/packing_ab.py F   # a bench/floor.py config

One Trainer on the config (bench/floor.py's configs, fp32 where the machine picks it), one training step, then the
same generation (prompts, seeds) 6 times per way, alternating which goes first; prints min, median and every time.
The choices measured land in packing.json beside the precision cache (printed at the end).
"""

from __future__ import annotations

import json
import sys

import rlvr.models.packed_linears as packed_linears
from generation_ab import generation_ab
from rlvr.models.machine_cache import precision_cache_path, read_cache


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "F"
    measured = packed_linears.fp32_packs
    ways = {
        "all packed": lambda: setattr(packed_linears, "fp32_packs", lambda i, o, rows: True),
        "measured": lambda: setattr(packed_linears, "fp32_packs", measured),
    }
    generation_ab(name, ways, reps=6)
    for key, entry in read_cache(precision_cache_path().with_name("packing.json")).items():
        k, ratio = json.loads(key), entry["packed_s"] / entry["plain_s"]
        print(f"  {k['in']} -> {k['out']} at {k['rows']} rows: packed/F.linear {ratio:.2f}, packs {entry['packs']}")


if __name__ == "__main__":
    main()
