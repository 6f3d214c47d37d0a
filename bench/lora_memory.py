"""Peak RSS of LoRA vs a full fine-tune, and copies of the base weights with a KL penalty.

Each variant runs in its own fresh process (peak RSS is per process): 2 GRPO steps on a locally
built Llama with the character tokenizer. Default: the 25M model (hidden 512, 8 layers, 8 heads,
intermediate 1376); --small: a 11M one, full and lora only (the fast test). Writes bench/results/lora_memory.md
unless --json (then one JSON line on stdout).

    OMP_NUM_THREADS=1 python bench/lora_memory.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {
    "full": [],
    "lora": ["model.lora.r=8"],
    "full_beta": ["algo.beta=0.04"],
    "lora_beta": ["model.lora.r=8", "algo.beta=0.04"],
}
SIZES = {
    "25m": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8, intermediate_size=1376),
    "small": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=6, intermediate_size=1024),
}
REWARD = "def digits(prompts, completions, **kw):\n    return [sum(c.isdigit() for c in x) / max(1, len(x)) for x in completions]\n"


def build_model(path: Path, size: str) -> None:
    from _models import char_llama

    char_llama(path, SIZES[size], max_positions=256, tie=True)


def child(model: str, reward: str, variant: str) -> None:
    """One variant: 2 steps, then report peak RSS and how many copies of the base weights exist."""
    import peft  # noqa: F401  every variant imports the same modules: the difference is training state
    import torch

    from rlvr.config import load_config
    from rlvr.training import Trainer

    torch.set_num_threads(1)
    cfg = load_config(
        None,
        [
            f"model.path={model}",
            "threads=1",
            "rollout.prompts_per_step=4",
            "rollout.group_size=4",
            "rollout.max_new_tokens=16",
            "optim.lr=1e-4",
            f"rewards.0.fn={reward}:digits",
            *VARIANTS[variant],
        ],
    )
    t = Trainer(cfg)
    t0 = time.perf_counter()
    for _ in range(2):
        t.train_step()
    secs = (time.perf_counter() - t0) / 2
    mods = [t.model] + ([t.ref_model] if t.ref_model is not None else [])
    storages = {}
    for m in mods:
        for n, p in m.named_parameters():
            if "lora_" not in n:
                storages[p.untyped_storage().data_ptr()] = p.untyped_storage().nbytes()
    base = sum(
        {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for n, p in t.model.named_parameters() if "lora_" not in n}.values()
    )
    print(
        json.dumps(
            {
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "base_copies": round(sum(storages.values()) / base),
                "params_m": sum(p.numel() for p in t.model.parameters()) / 1e6,
                "trainable_m": sum(p.numel() for p in t.model.parameters() if p.requires_grad) / 1e6,
                "sec_per_step": secs,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", nargs=3)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    size = "small" if args.small else "25m"
    with tempfile.TemporaryDirectory() as tmp:
        model, reward = Path(tmp) / "model", Path(tmp) / "reward.py"
        build_model(model, size)
        reward.write_text(REWARD)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        res = {}
        for v in ["full", "lora"] if args.small else VARIANTS:
            out = subprocess.run([sys.executable, __file__, "--child", str(model), str(reward), v], capture_output=True, text=True, env=env)
            if out.returncode:
                sys.exit(out.stderr[-3000:])
            res[v] = json.loads(out.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(res))
        return
    lines = [
        f"# LoRA vs full fine-tune: peak RSS ({size} model, CPU fp32, 2 GRPO steps of 4x4 completions, 16 new tokens)",
        "",
        "Each row is a fresh process (`OMP_NUM_THREADS=1 python bench/lora_memory.py`); peak RSS includes the",
        "interpreter, torch and transformers. `base copies`: distinct storages of the base weights over the",
        "policy and the reference model, in units of one model.",
        "",
        "| variant | params (M) | trainable (M) | peak RSS (MB) | base copies | s/step |",
        "|---|---|---|---|---|---|",
    ]
    for v, r in res.items():
        lines.append(
            f"| {v} | {r['params_m']:.1f} | {r['trainable_m']:.2f} | {r['peak_rss_mb']:.0f} "
            f"| {r['base_copies']} | {r['sec_per_step']:.2f} |"
        )
    out = Path(__file__).parent / "results" / "lora_memory.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
