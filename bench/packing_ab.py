"""fp32 generation with every large weight packed (the rule before packing was measured per machine) against the
packing each weight shape measures faster on this machine (rlvr.models.packed_linears.fp32_packs), in one process.

    RLVR_PRECISION_CACHE=/tmp/pc/precision.json python bench/packing_ab.py F   # a bench/floor.py config

One Trainer on the config (bench/floor.py's configs, fp32 where the machine picks it), one training step, then the
same generation (prompts, seeds) 6 times per way, alternating which goes first; prints min, median and every time.
The choices measured land in packing.json beside the precision cache (printed at the end).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import types

import torch

import compare_trl
import floor
import rlvr.models.packed_linears as packed_linears
from rlvr.config import load_config
from rlvr.models.machine_cache import precision_cache_path, read_cache
from rlvr.training import Trainer


def main() -> None:
    torch.set_num_threads(2)
    name = sys.argv[1] if len(sys.argv) > 1 else "F"
    a = types.SimpleNamespace(threads=2, warmup=1, steps=3)
    spec = {**floor.make_spec(name, floor.build_inputs([name]), a), "out": tempfile.mkdtemp()}
    trainer = Trainer(load_config(None, compare_trl.rlvr_overrides(spec)), logger_live=False)
    generate, call = trainer.engine.generate, {}

    def recording(prompts, params, seeds):
        call.update(prompts=list(prompts), params=params, seeds=list(seeds))
        return generate(prompts, params, seeds)

    trainer.engine.generate = recording
    trainer.train_step()
    measured, times = packed_linears.fp32_packs, {"all packed": [], "measured": []}
    for i in range(6):
        for way in ("all packed", "measured") if i % 2 == 0 else ("measured", "all packed"):
            packed_linears.fp32_packs = (lambda i, o, rows: True) if way == "all packed" else measured  # type: ignore[assignment]
            t = time.perf_counter()
            generate(call["prompts"], call["params"], call["seeds"])
            times[way].append(time.perf_counter() - t)
    print(f"config {name}, {trainer.precision.describe()}")
    for way, ts in times.items():
        print(f"{way}: generation min {min(ts):.3f} s, median {statistics.median(ts):.3f} s, {[round(t, 3) for t in ts]}")
    for key, entry in read_cache(precision_cache_path().with_name("packing.json")).items():
        k, ratio = json.loads(key), entry["packed_s"] / entry["plain_s"]
        print(f"  {k['in']} -> {k['out']} at {k['rows']} rows: packed/F.linear {ratio:.2f}, packs {entry['packs']}")


if __name__ == "__main__":
    main()
