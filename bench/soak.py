"""Soak test: the bundled demo killed with SIGKILL at random points and resumed ends with the
same weights (bitwise) and the same metrics as an uninterrupted run.

    OMP_NUM_THREADS=1 python bench/soak.py --steps 300 --save-every 10 --kills 8 --out bench/results/soak.md
"""

from __future__ import annotations

import argparse
import os
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file


def run(out: Path, steps: int, save_every: int, resume: bool) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "rlvr",
        "train",
        f"steps={steps}",
        f"save_every={save_every}",
        "keep_checkpoints=3",
        "eval_before_after=false",
        "log_completions_every=0",
        f"output_dir={out}",
    ]
    if resume:
        cmd.append("resume=auto")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def steps_logged(out: Path) -> int:
    f = out / "metrics.jsonl"
    return len(f.read_text().splitlines()) if f.exists() else 0


def metrics(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/soak.md"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="rlvr-soak-"))
    straight, killed = work / "straight", work / "killed"

    t0 = time.time()
    proc = run(straight, args.steps, args.save_every, resume=False)
    assert proc.wait() == 0, proc.stderr.read()
    t_straight = time.time() - t0

    # kill points: distinct random step counts, in order; each kill lands while that step is running
    kill_at = sorted(rng.sample(range(5, args.steps - 5), args.kills))
    log, t0, resumed = [], time.time(), False
    for target in kill_at:
        proc = run(killed, args.steps, args.save_every, resume=resumed)
        while steps_logged(killed) < target and proc.poll() is None:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.1))  # somewhere inside the next step (or a checkpoint write)
        proc.kill()
        proc.wait()
        ckpts = sorted((killed / "checkpoints").glob("step-*"))
        log.append((target, steps_logged(killed), ckpts[-1].name if ckpts else "none"))
        resumed = True
    proc = run(killed, args.steps, args.save_every, resume=True)
    assert proc.wait() == 0, proc.stderr.read()
    t_killed = time.time() - t0

    w1, w2 = load_file(str(straight / "final" / "model.safetensors")), load_file(str(killed / "final" / "model.safetensors"))
    same_weights = w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    same_metrics = metrics(straight) == metrics(killed)
    lines = [
        "# Soak: kill -9 at random points, resume, compare with an uninterrupted run",
        "",
        f"Command: `OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')} python bench/soak.py "
        f"--steps {args.steps} --save-every {args.save_every} --kills {args.kills} --seed {args.seed}`",
        f"(bundled tiny model on `arithmetic`, default demo settings, CPU, {time.strftime('%Y-%m-%d')})",
        "",
        f"- uninterrupted run: {t_straight:.0f} s; killed {args.kills} times and resumed: {t_killed:.0f} s in all",
        f"- final weights bitwise identical: **{same_weights}**",
        f"- metrics.jsonl identical (every value except wall-clock timings, every step exactly once): **{same_metrics}**",
        "",
        "| kill # | killed after step logged | steps logged at kill | newest complete checkpoint |",
        "|---|---|---|---|",
        *[f"| {i + 1} | {t} | {n} | {c} |" for i, (t, n, c) in enumerate(log)],
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    sys.exit(0 if same_weights and same_metrics else 1)


if __name__ == "__main__":
    main()
