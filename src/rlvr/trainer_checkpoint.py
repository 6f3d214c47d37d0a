"""Writing a trainer's checkpoint and resuming a trainer from one: weights (or the LoRA adapter),
optimizer, scheduler, data position, RNG. Single process, DDP and FSDP2 write the same files, so a
checkpoint resumes under any strategy and number of ranks. `trainer` is the rlvr.trainer.Trainer."""

from __future__ import annotations

from pathlib import Path

import yaml

from rlvr.checkpoint import (
    latest_checkpoint,
    load_trainer_state,
    load_weights,
    math_changes,
    read_weights,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from rlvr.config import ConfigError, to_dict


def save_trainer_checkpoint(trainer) -> Path:
    """Rank 0 writes; every rank resumes from what it wrote. FSDP2: every rank first helps
    gather the full weights and optimizer state onto rank 0, which writes them exactly as one
    process would (a checkpoint resumes under any strategy and number of ranks)."""
    path = trainer.output_dir / "checkpoints" / f"step-{trainer.step:07d}"
    model = trainer.policy.peft or trainer.model  # what save_pretrained writes: the adapter with LoRA
    full = trainer.dist.full_model_state(model)  # FSDP2: collectives; None otherwise
    full_optim = trainer.dist.full_optimizer_state(trainer.model, trainer.optimizer)
    if not trainer.dist.is_main:
        trainer.dist.barrier("checkpoint")
        return path
    state = {
        "step": trainer.step,
        "num_tokens": trainer.num_tokens,
        "optimizer": trainer.optimizer.state_dict() if full_optim is None else full_optim,
        "scheduler": trainer.scheduler.state_dict(),
        "data": trainer.stream.state_dict(),
        "skipped_steps": trainer.skipped_steps,
        "rng": rng_state(),
    }
    path = save_checkpoint(
        trainer.output_dir / "checkpoints", trainer.step, model=model, tokenizer=trainer.tokenizer,
        trainer_state=state, config=to_dict(trainer.cfg), keep=trainer.cfg.keep_checkpoints, state_dict=full,
    )
    trainer.dist.barrier("checkpoint")
    return path


def resume_trainer(trainer, where: str, force: bool) -> None:
    path = latest_checkpoint(trainer.output_dir / "checkpoints") if where == "auto" else Path(where)
    if path is None:
        return  # resume=auto with nothing saved yet: a fresh start
    if not (path / "trainer_state.pt").exists():
        raise FileNotFoundError(f"resume: {path} is not a complete checkpoint (no trainer_state.pt)")
    saved_cfg = yaml.safe_load((path / "config.yaml").read_text())
    changes = math_changes(saved_cfg, to_dict(trainer.cfg))
    if changes and not force:
        raise ConfigError(
            f"resume: the config differs from checkpoint {path} in settings that change the math:\n  - "
            + "\n  - ".join(changes) + "\nrevert them, or pass --force to resume anyway"
        )
    state = load_trainer_state(path)
    if trainer.dist.strategy == "fsdp":  # every rank reads the whole files and keeps its shard
        if trainer.policy.peft is not None:
            trainer.dist.load_full_model_state(trainer.policy.peft, trainer.policy.adapter_state_by_name(path), strict=False)
        else:
            trainer.dist.load_full_model_state(trainer.model, read_weights(path))
        trainer.dist.load_full_optimizer_state(trainer.model, trainer.optimizer, state["optimizer"])
    else:
        trainer.policy.load_adapter_weights(path) if trainer.policy.peft is not None else load_weights(path, trainer.model)
        trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.stream.load_state_dict(state["data"])
    set_rng_state(state["rng"])
    trainer.step, trainer.num_tokens = state["step"], state["num_tokens"]
    trainer.skipped_steps = state.get("skipped_steps", 0)
    trainer.resumed_from = path
    trainer.engine.sync_weights()
