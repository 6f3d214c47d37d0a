"""`rlvr.train(config, *overrides) -> Run`: a GRPO run from Python (a script or a notebook), the same run
`rlvr train` starts; the CLI builds its config from argv and calls `run_training` here.

The config is a Config, a dict nested as the YAML would be, a YAML path, or None (the bundled demo), plus
dotted `key=value` overrides exactly as on the command line; every one is checked as the CLI checks it
(unknown keys named with the closest valid one). `resume=RUN_DIR` continues a run from its newest
checkpoint with its own config.yaml (`rlvr train --resume RUN_DIR`). Mistakes raise (ConfigError,
TrainingError, RunFinished) where the CLI prints them and exits with a status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.config import Config, ConfigError, load_config, to_dict

__all__ = ["Run", "config_for", "resume_config", "run_training", "train"]


@dataclass
class Run:
    """A finished (or stopped) run: its folder, summary.json's content and the trained model."""

    output_dir: Path
    summary: dict[str, Any]
    final_model: Path | None = None  # output_dir/final (a Hugging Face model folder), once the run finished
    interrupted_at: int | None = None  # the step a stop signal ended the run after (resume with resume=output_dir)
    rank: int = field(default=0, repr=False)  # under torchrun: this process's rank (only rank 0 writes the run's files)

    @classmethod
    def from_summary(cls, summary: dict[str, Any], rank: int = 0) -> Run:
        out, stopped = Path(summary["output_dir"]), summary.get("interrupted_at")
        final = out / "final"  # a stopped run's final/ (if any) is an earlier segment's, not this run's end
        return cls(out, summary, final if final.is_dir() and stopped is None else None, stopped, rank)

    def metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl's rows, one dict per step in step order (`step`, `reward`, `kl`, `loss`, ...; a step
        logged again after a resume: its last line)."""
        from rlvr.observe.run_files import read_metrics

        return read_metrics(self.output_dir) if (self.output_dir / "metrics.jsonl").is_file() else []

    def held_out_line(self) -> str | None:
        """`held-out accuracy: 12.0% -> 30.0% (+18.0 points) in 40s of training`, when the run scored before and after."""
        s = self.summary
        if "eval_before" not in s or "eval_after" not in s:
            return None
        b, a, label = s["eval_before"], s["eval_after"], s["eval_label"]
        change = f"{b:.1%} -> {a:.1%} ({(a - b) * 100:+.1f} points)" if label == "accuracy" else f"{b:.3f} -> {a:.3f} ({a - b:+.3f})"
        return f"held-out {label}: {change} in {s['train_seconds']:.0f}s of training"

    def __repr__(self) -> str:
        if self.interrupted_at is not None:
            resume = f"rlvr.train(resume={str(self.output_dir)!r})"
            lines = [f"Run({self.output_dir}): stopped after step {self.interrupted_at}; {resume} continues it"]
        else:
            lines = [f"Run({self.output_dir}): {self.summary.get('steps', '?')} steps"]
        if line := self.held_out_line():
            lines.append(f"  {line}")
        if self.final_model is not None:
            lines.append(f"  final model: {self.final_model}")
        return "\n".join(lines)


def train(
    config: Config | Mapping[str, Any] | str | Path | None = None,
    *overrides: str,
    force: bool = False,
    resume: str | Path | None = None,
    progress: bool | None = None,
) -> Run:
    """Train with GRPO, as `rlvr train [CONFIG] [key=value ...] [--force] [--resume RUN_DIR]` does.

    `config`: a Config, a dict (nested as the YAML), a YAML file or None (the bundled demo); `overrides`:
    dotted `key=value` strings. `resume`: a run's folder, continued with its own config.yaml (then `config`
    must be None). `progress`: the live display (None: on a terminal and in Jupyter, plain lines otherwise).
    Several processes (nproc > 1) need torchrun around the script; the CLI launches them itself."""
    if resume is not None and config is not None:
        raise ConfigError(f"resume={resume} takes the run's own config.yaml: give only key=value overrides, not a config")
    cfg = resume_config(Path(resume), None, list(overrides), force=force) if resume is not None else config_for(config, overrides)
    return run_training(cfg, force=force, progress=progress)


def config_for(config: Config | Mapping[str, Any] | str | Path | None, overrides: Sequence[str] = ()) -> Config:
    """The Config that `config` and the overrides describe, checked as a YAML file and the command line are."""
    if isinstance(config, Config):
        return load_config(to_dict(config), overrides)
    if config is not None and not isinstance(config, (Mapping, str, Path)):
        raise ConfigError(f"config must be a rlvr Config, a dict, a YAML path or None, not {type(config).__name__}")
    return load_config(config, overrides)


def resume_config(run: Path, config_path: str | None, overrides: list[str], *, force: bool) -> Config:
    """The config `--resume RUN` continues with: the run's config.yaml (as it ran) plus the overrides, which may
    change only what leaves the math alone (steps, logging, checkpointing) unless `force`."""
    from rlvr.training.checkpoint import RESUMABLE_CHANGES, latest_checkpoint, math_changes, old_run_overrides

    saved = run / "config.yaml"
    if config_path is not None:
        raise ConfigError(f"--resume {run} takes the run's own config.yaml: give only key=value overrides, not {config_path}")
    if not saved.is_file():
        raise ConfigError(f"--resume {run}: no config.yaml there; name the folder of a run (the output_dir it was started with)")
    if latest_checkpoint(run / "checkpoints") is None:
        raise ConfigError(
            f"--resume {run}: the run has no checkpoint to resume from (one is written every checkpoint.every steps, "
            "and when a run is stopped by SIGINT/SIGTERM/SIGHUP)"
        )
    import yaml

    old = old_run_overrides(yaml.safe_load(saved.read_text()) or {})  # fields added since it was written: as it ran
    before = load_config(saved, old)
    cfg = load_config(saved, [*old, *overrides, f"output_dir={run}", "resume=auto"])
    changes = math_changes(to_dict(before), to_dict(cfg))
    if changes and not force:
        allowed = ", ".join(sorted(k for k in RESUMABLE_CHANGES if k != "resume"))
        raise ConfigError(
            f"--resume {run}: these overrides change the math of the run:\n  - "
            + "\n  - ".join(changes)
            + f"\nresuming allows only {allowed}; start a new run (another output_dir) for the others, or pass --force"
        )
    return cfg


def run_training(cfg: Config, *, force: bool = False, progress: bool | None = None) -> Run:
    """Train `cfg` in this process (one of torchrun's, when nproc > 1). Raises RunFinished (a resumed run already
    at its steps: nothing touched), TrainingError (the run cannot go on) and StopAtOnce (a third stop signal),
    its message naming the newest complete checkpoint."""
    import torch

    from rlvr.dist import under_torchrun
    from rlvr.training import StopAtOnce, Trainer, TrainingError

    if cfg.nproc > 1 and not under_torchrun():
        raise ConfigError(
            f"nproc={cfg.nproc} needs one process per rank: launch this script with `torchrun --nproc-per-node {cfg.nproc} "
            "script.py`, or train with the CLI (`rlvr train nproc=N ...` starts torchrun itself)"
        )
    if cfg.threads:  # process-wide, so set here and not by the library
        torch.set_num_threads(cfg.threads)
    trainer = Trainer(cfg, force=force, logger_live=progress)
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its "Writing model shards" bars would break into the live display
    try:
        summary = trainer.train()
    except TrainingError:
        trainer.dist.close()
        raise
    except StopAtOnce:  # checkpoints are whole or absent: say which one is left
        from rlvr.training.checkpoint import latest_checkpoint

        newest = latest_checkpoint(trainer.output_dir / "checkpoints")
        how = f"resume with: rlvr train --resume {trainer.output_dir}" if newest else "no checkpoint was written yet"
        raise StopAtOnce(f"stopped at once; newest complete checkpoint: {newest or 'none'}; {how}") from None
    finally:
        if bars:  # a notebook goes on after the run: its own downloads keep their bars
            hf_logging.enable_progress_bar()
    trainer.dist.close()
    return Run.from_summary(summary, rank=trainer.dist.rank)
