"""Generation with the shared-prompt decode attention as this machine's timing chooses it (decode_attention.shared_flash_pays)
against the explicit products always, in one process, alternating:

    RLVR_PRECISION_CACHE=/tmp/pc/precision.json python bench/decode_attention_choice_ab.py F 4   # from bench/
"""

import statistics
import sys
import tempfile
import time
import types

import torch

import compare_trl
import floor
import rlvr.rollout.engines.hf.decode_attention as da
import rlvr.rollout.engines.hf.lean_decode as ld
from rlvr.config import load_config
from rlvr.training import Trainer

torch.set_num_threads(2)
measured = ld.shared_flash_pays
name = sys.argv[1]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
a = types.SimpleNamespace(threads=2, warmup=1, steps=3)
spec = {**floor.make_spec(name, floor.build_inputs([name]), a), "out": tempfile.mkdtemp()}
tr = Trainer(load_config(None, compare_trl.rlvr_overrides(spec)), logger_live=False)
gen, call = tr.engine.generate, {}


def rec(p, pa, s):
    call.update(p=list(p), pa=pa, s=list(s))
    return gen(p, pa, s)


tr.engine.generate = rec
tr.train_step()
res = {"explicit": [], "measured": []}
for i in range(reps):
    for w in ("explicit", "measured") if i % 2 == 0 else ("measured", "explicit"):
        ld.shared_flash_pays = (lambda *a: False) if w == "explicit" else measured
        t = time.perf_counter()
        gen(call["p"], call["pa"], call["s"])
        res[w].append(time.perf_counter() - t)
for k, v in res.items():
    print(name, k, "min", round(min(v), 3), "median", round(statistics.median(v), 3), [round(x, 3) for x in v], flush=True)
print(name, "choices", da._CHOICES)
