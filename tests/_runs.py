"""Real runs shared by the doctor / report / console tests, made once per session.

The "healthy" run is a real `rlvr train` through the CLI (conftest's `rlvr_cli`, passed in as
`cli`), stdout piped (so it also shows what CI sees), on the session's tiny random model
(`tiny_model_dir` in conftest.py). A random model never solves arithmetic, so every group would
have identical zero rewards (which the doctor rightly flags); the run therefore trains on a
partial-credit reward (share of digits in the completion), which gives every group a spread of
rewards and rises over 30 steps, like a healthy run does.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

DENSE_REWARD = '''
def digit_share(prompts, completions, **kwargs):
    """Partial credit: the share of the completion's characters that are digits."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else "".join(m.get("content", "") for m in c)
        out.append(sum(ch.isdigit() for ch in text) / max(1, len(text)))
    return out
'''

_CACHE: dict[str, tuple[Path, str]] = {}


def train_cli(cli, out: Path, *overrides: str, timeout: int = 180) -> subprocess.CompletedProcess:
    """`rlvr train output_dir=OUT threads=1 OVERRIDES...` through `cli` (conftest's rlvr_cli); it must succeed."""
    return cli("train", f"output_dir={out}", "threads=1", *overrides, timeout=timeout, check=True)


def healthy_run(tmp_path_factory, tiny_model_dir: str, cli) -> tuple[Path, str]:
    """(run folder, captured stdout) of a 30-step real run; made once per session."""
    if "healthy" not in _CACHE:
        root = tmp_path_factory.mktemp("healthy_run")
        reward = root / "dense_reward.py"
        reward.write_text(DENSE_REWARD)
        out = root / "run"
        proc = train_cli(
            cli,
            out,
            f"model.path={tiny_model_dir}",
            f"rewards=[{reward}:digit_share]",
            "steps=30",
            "rollout.prompts_per_step=8",
            "optim.lr=1e-3",
            "data.eval_size=20",
            "log_completions_every=5",
            "num_completions_logged=16",
        )
        _CACHE["healthy"] = (out, proc.stdout)
    return _CACHE["healthy"]


def kl_run(tmp_path_factory, tiny_model_dir: str, cli) -> Path:
    """A second, shorter real run with a KL penalty (beta > 0), for overlays and the KL plot."""
    if "kl" not in _CACHE:
        root = tmp_path_factory.mktemp("kl_run")
        reward = root / "dense_reward.py"
        reward.write_text(DENSE_REWARD)
        out = root / "run"
        proc = train_cli(
            cli,
            out,
            f"model.path={tiny_model_dir}",
            f"rewards=[{reward}:digit_share]",
            "steps=10",
            "rollout.prompts_per_step=8",
            "optim.lr=1e-3",
            "algo.beta=0.04",
            "eval_before_after=false",
            "log_completions_every=5",
        )
        _CACHE["kl"] = (out, proc.stdout)
    return _CACHE["kl"][0]


def write_metrics(path: Path, rows: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with (path / "metrics.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path
