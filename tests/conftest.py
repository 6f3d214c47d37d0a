"""Shared fixtures: a tiny random Llama with the project's character tokenizer, built once per
session; one factory for in-process trainers (`make_trainer`); one runner for the `rlvr` CLI in
a subprocess (`rlvr_cli`).

Trainer-level tests pass `model.path=<tiny_model_dir>` (the factory's default) so they never
depend on the bundled model (or on anything downloaded); tests that want the bundled model pass
`model.path=tiny`.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="session", autouse=True)
def precision_cache(tmp_path_factory):
    """model.autocast=auto remembers its timings in this session's file (also for `rlvr` subprocesses),
    never in the user's ~/.cache/rlvr/precision.json."""
    from rlvr.models.precision_choice import CACHE_ENV

    path = tmp_path_factory.mktemp("precision") / "precision.json"
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(path)
    yield path
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    import torch
    from transformers import LlamaForCausalLM

    from rlvr.models.build import char_llama_config

    from rlvr.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    torch.manual_seed(1234)
    model = LlamaForCausalLM(char_llama_config(tok, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2))
    path = tmp_path_factory.mktemp("tiny_random_model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


# ------------------------------------------------------------------------------------ in process


def trainer_defaults(model_path: str, output_dir) -> list[str]:
    """Fast defaults for an in-process Trainer: a few short steps, nothing but metrics.jsonl written,
    fp32 (the tests compare numbers at fp32 tolerances, whichever precision this machine runs fastest;
    tests/models/test_precision_auto.py tests model.autocast=auto)."""
    return [
        f"model.path={model_path}",
        "eval_before_after=false",
        "steps=3",
        "rollout.group_size=4",
        "rollout.prompts_per_step=4",
        "rollout.max_new_tokens=4",
        f"output_dir={output_dir}",
        "log_completions_every=0",
        "report_to=[]",
        "model.autocast=none",
    ]


@pytest.fixture
def make_trainer(tiny_model_dir, tmp_path):
    """make(*overrides, run="run", force=False, source=None, config=None) -> rlvr.training.Trainer

    The config is trainer_defaults(tiny_model_dir, tmp_path / run) followed by `overrides`
    (later ones win), or, with `config` (a YAML file), that file with `overrides` only; the
    console is plain lines (logger_live=False)."""
    from rlvr.config import load_config
    from rlvr.training import Trainer

    def make(*overrides: str, run: str = "run", force: bool = False, source=None, config=None) -> Trainer:
        if config is not None:
            cfg = load_config(config, list(overrides))
        else:
            cfg = load_config(None, [*trainer_defaults(tiny_model_dir, tmp_path / run), *overrides])
        return Trainer(cfg, force=force, logger_live=False, source=source)

    return make


# ------------------------------------------------------------------------------------ the CLI


def _causes(stderr: str, most: int = 40) -> str:
    """The lines of stderr that name an error, a signal or an abort (up to `most`), as a block for a failure message."""
    words = ("error", "exception", "terminate", "abort", "signal", "killed", "fatal")
    lines = [line for line in stderr.splitlines() if any(w in line.lower() for w in words)][:most]
    return "\n[stderr lines naming a cause]\n" + "\n".join(lines) + "\n[stderr tail]\n" if lines else ""


class RlvrCli:
    """`python -m rlvr ARGS...` in a subprocess, with this interpreter (so this checkout's rlvr).

    cli(*args, timeout=120, check=False, env=None) -> CompletedProcess (text, stdout/stderr
    captured); check=True asserts exit status 0 and shows, when it is not, the output's tail and before it every
    line of stderr that names an error, a signal or an abort (another rank's cause scrolls out of the tail).
    cli.command(*args) is the command line, cli.popen(*args, **kw) starts it without waiting
    (for tests that signal or kill the run). `env`: variables added to this process's."""

    def command(self, *args) -> list[str]:
        return [sys.executable, "-m", "rlvr", *map(str, args)]

    @staticmethod
    def _env(env: dict | None) -> dict | None:
        return None if env is None else {**os.environ, **env}

    def __call__(self, *args, timeout: float = 120, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout, env=self._env(env))
        if check:
            assert proc.returncode == 0, proc.stdout[-2000:] + _causes(proc.stderr) + proc.stderr[-3000:]
        return proc

    def popen(self, *args, env: dict | None = None, **kw) -> subprocess.Popen:
        kw = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **kw}
        return subprocess.Popen(self.command(*args), env=self._env(env), **kw)


@pytest.fixture(scope="session")
def rlvr_cli() -> RlvrCli:
    return RlvrCli()
