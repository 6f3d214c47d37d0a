"""kill -9 at random moments: a finished run is never changed, and a run is always resumable afterwards.

Three scenarios, each trial on a fresh copy of a finished base run (tiny model, `steps=4`, `save_every=2`):

- `continue`: `rlvr train --resume RUN steps=7` killed at a random moment, then resumed to 7 steps. Checked:
  the base run's 4 logged lines are untouched; final/ is the base run's or a whole new one (never a mix);
  the resume completes, logs steps 1-7 once each, and its final weights equal a straight 7-step run's bit for bit.
- `same`: `rlvr train --resume RUN steps=4` (nothing to do) killed at a random moment: every file unchanged.
- `force`: `rlvr train ... --force` (a new run in the used folder) killed at a random moment. Checked: the base
  run is whole (every file's md5) either still in RUN or in exactly one `RUN.replaced-*`, and a new --force run
  in RUN then completes.
- `checkpoint`: a fresh 6-step run with `save_every=1` (a checkpoint write every step) killed at a random
  moment, then `resume=auto`: it completes with steps 1-6 once each and the straight run's weights.

    python bench/kill_soak.py --trials 8 --out bench/results/kill_soak.md
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from rlvr.models.precision_choice import cpu_model  # noqa: E402

BASE = [
    "model.path=tiny",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=8",
    "eval_before_after=false",
    "optim.lr=1e-3",
    "log_completions_every=1",
    "threads=1",
    "report_to=[]",
    "save_every=2",
]


def rlvr(*args, timeout=300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "rlvr", *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def killed_at(args: list, when: float) -> float:
    """Start `rlvr ARGS`, SIGKILL it `when` seconds later (if still running); seconds it actually ran."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "rlvr", *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        proc.wait(timeout=when)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return time.time() - t0


def tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def weights(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def steps(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def timed(args: list) -> float:
    t0 = time.time()
    done = rlvr(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    return time.time() - t0


class Soak:
    def __init__(self, work: Path, rng: random.Random):
        self.work, self.rng, self.rows = work, rng, []
        self.base = work / "base"
        self.t_base = timed(["train", *BASE, "steps=4", f"output_dir={self.base}"])
        self.base_tree = tree(self.base)
        self.straight7 = work / "straight7"
        timed(["train", *BASE, "steps=7", f"output_dir={self.straight7}"])
        self.straight6 = work / "straight6"
        # each command's own length, uninterrupted: kills are drawn over it
        self.span = {
            "checkpoint": timed(["train", *BASE, "steps=6", "save_every=1", f"output_dir={self.straight6}"]),
            "continue": timed(["train", "--resume", self.copy("timing"), "steps=7"]),
            "same": timed(["train", "--resume", self.base, "steps=4"]),
        }
        self.span["force"] = timed(["train", *BASE, "steps=3", "seed=7", f"output_dir={self.copy('timing-force')}", "--force"])

    def copy(self, name: str) -> Path:
        run = self.work / name
        shutil.copytree(self.base, run)
        return run

    def record(self, scenario: str, when: float, state: str, ok: bool, detail: str = "") -> None:
        self.rows.append((scenario, when, state, ok, detail))
        print(f"{scenario:10s} kill at {when:5.2f}s  {state:38s} {'ok' if ok else 'FAILED ' + detail}", flush=True)

    def continue_(self, i: int) -> None:
        run = self.copy(f"continue-{i}")
        when = killed_at(["train", "--resume", run, "steps=7"], self.rng.uniform(0.2, self.span["continue"]))
        lines = (run / "metrics.jsonl").read_text().splitlines()
        base_lines = (self.base / "metrics.jsonl").read_text().splitlines()
        untouched = lines[:4] == base_lines
        final = tree(run / "final")
        base_final = {k[6:]: v for k, v in self.base_tree.items() if k.startswith("final/")}
        whole_final = final == base_final or same(weights(run / "final"), weights(self.straight7 / "final"))
        state = f"{len(lines)} lines, final {'base' if final == base_final else 'new'}"
        done = rlvr("train", "--resume", run, "steps=7")
        ok = untouched and whole_final and done.returncode == 0 and steps(run) == list(range(1, 8))
        ok = ok and same(weights(run / "final"), weights(self.straight7 / "final"))
        self.record("continue", when, state, ok, done.stderr[-300:])

    def same_steps(self, i: int) -> None:
        run = self.copy(f"same-{i}")
        when = killed_at(["train", "--resume", run, "steps=4"], self.rng.uniform(0.2, self.span["same"]))
        self.record("same", when, "nothing to do", tree(run) == self.base_tree)

    def force(self, i: int) -> None:
        run = self.copy(f"force-{i}")
        when = killed_at(["train", *BASE, "steps=3", "seed=7", f"output_dir={run}", "--force"], self.rng.uniform(0.2, self.span["force"]))
        aside = sorted(run.parent.glob(f"{run.name}.replaced-*"))
        in_place = run.is_dir() and tree(run) == self.base_tree
        kept = len(aside) == 1 and tree(aside[0]) == self.base_tree
        state = "base still in place" if in_place else f"base in {aside[0].name.split('.')[-1]}" if kept else "base NOT whole"
        again = rlvr("train", *BASE, "steps=3", "seed=7", f"output_dir={run}", "--force")
        self.record("force", when, state, (in_place or kept) and again.returncode == 0, again.stderr[-300:])

    def checkpoint(self, i: int) -> None:
        run = self.work / f"checkpoint-{i}"
        args = ["train", *BASE, "steps=6", "save_every=1", f"output_dir={run}"]
        when = killed_at(args, self.rng.uniform(0.2, self.span["checkpoint"]))
        ckpts = sorted(p.name for p in (run / "checkpoints").glob("step-*")) if (run / "checkpoints").is_dir() else []
        state = f"checkpoints {','.join(c[-1] for c in ckpts) or 'none'}" + (", finished" if (run / "summary.json").exists() else "")
        done = rlvr(*args, "resume=auto")
        ok = done.returncode == 0 and steps(run) == list(range(1, 7)) and same(weights(run / "final"), weights(self.straight6 / "final"))
        self.record("checkpoint", when, state, ok, done.stderr[-300:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=8, help="trials per scenario (same: half as many)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write a markdown table here")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        soak = Soak(Path(tmp), rng)
        for i in range(args.trials):
            soak.continue_(i)
            soak.force(i)
            soak.checkpoint(i)
            if i % 2 == 0:
                soak.same_steps(i)
    failed = [r for r in soak.rows if not r[3]]
    print(f"{len(soak.rows) - len(failed)} passed, {len(failed)} failed")
    if args.out:
        lines = [
            f"# kill -9 soak\n\n`python bench/kill_soak.py --trials {args.trials} --seed {args.seed}` on {cpu_model()}, "
            f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}. Each kill is drawn uniformly between 0.2 s and the length of "
            "the same command uninterrupted (process start included): " + ", ".join(f"{k} {v:.1f} s" for k, v in soak.span.items()) + ".\n",
            "What each scenario checks: see the script's docstring.\n",
            f"**{len(soak.rows) - len(failed)} trials passed, {len(failed)} failed.**\n",
            "| scenario | killed after | what the kill left | verdict |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {s} | {w:.2f} s | {st} | {'ok' if ok else 'FAILED: ' + d.strip().replace(chr(10), ' ')[:120]} |"
            for s, w, st, ok, d in soak.rows
        ]
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
