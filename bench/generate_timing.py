"""Time the hf engine's `generate` alone on compare_trl's config A or B shapes, in whichever rlvr
tree PYTHONPATH selects (it runs on trees from before the redesign too), to tell a decode
regression from machine noise by alternating trees:

    for i in 1 2 3; do for t in OLD NEW; do PYTHONPATH=$t/src python bench/generate_timing.py --config B; done; done

Config B needs the 25M model compare_trl.py builds (/tmp/rlvr_bench/llama25m; run compare_trl once).
"""

import argparse
import json
import time
from pathlib import Path

import torch

import rlvr
from rlvr.config import load_config
from rlvr.data import render_prompt
from rlvr.rollout import SamplingParams

try:
    from rlvr.training import Trainer
except ImportError:  # before the redesign
    from rlvr.trainer import Trainer

HERE = Path(__file__).resolve().parent
SHAPES = {"A": (str(HERE.parent / "src/rlvr/models/tiny"), 16, 25), "B": ("/tmp/rlvr_bench/llama25m", 64, 6)}

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--config", choices=sorted(SHAPES), default="B")
a = ap.parse_args()
model, T, reps = SHAPES[a.config]
torch.set_num_threads(2)
overrides = [
    f"model.path={model}",
    "data.task=null",
    "data.path=/tmp/rlvr_bench/prompts_short.jsonl",
    "data.shuffle=false",
    f"rewards=[{HERE / 'bench_rewards.py'}:digit_share]",
    "rollout.group_size=8",
    "rollout.prompts_per_step=8",
    f"rollout.max_new_tokens={T}",
    "rollout.temperature=1.0",
    "rollout.ignore_eos=true",
    "threads=2",
    "device=cpu",
    "eval_before_after=false",
    "log_completions_every=0",
    "report_to=[]",
    "doctor_every=0",
    "output_dir=/tmp/rlvr_generate_timing",
    "seed=0",
]
t = Trainer(load_config(None, overrides), force=True, logger_live=False)
prompts = [render_prompt(r["prompt"], t.tokenizer, None) for r in t.stream.take(8)]
sampling = SamplingParams(n=8, temperature=1.0, max_new_tokens=T, ignore_eos=True)
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    t.engine.generate(prompts, sampling, list(range(8)))
    times.append(time.perf_counter() - t0)
print(
    json.dumps(
        {
            "rlvr": rlvr.__file__,
            "config": a.config,
            "seconds": [round(x, 3) for x in times],
            "median_after_first": round(sorted(times[1:])[(reps - 1) // 2], 3),
        }
    )
)
