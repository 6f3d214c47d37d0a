"""The train state the trainer owns, and writing/resuming checkpoints of it: weights (or the
LoRA adapter), optimizer, scheduler, data position, RNG and the counters. Single process, DDP
and FSDP2 write the same files, so a checkpoint resumes under any strategy and number of ranks."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from rlvr.config import ConfigError, to_dict
from rlvr.dist import full_model_state, full_optimizer_state, load_full_model_state, load_full_optimizer_state
from rlvr.training.checkpoint import (
    COMPLETE_MARKER,
    checkpoint_path,
    complete_saved_config,
    latest_checkpoint,
    load_reference,
    load_trainer_state,
    load_weights,
    math_changes,
    read_weights,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


@dataclass
class TrainState:
    """The loop's own counters (everything else resumable lives in the optimizer, scheduler, stream)."""

    step: int = 0  # steps done
    num_tokens: int = 0  # prompt + episode tokens seen so far
    skipped_steps: int = 0  # steps whose update was dropped for a non-finite loss or gradient
    train_seconds: float = 0.0  # wall time of the steps done, over every segment of a resumed run
    eval_before: float | None = None  # the held-out score before training (summary.json reports it after a resume too)
    entropy_control: dict | None = None  # algo.adaptive_entropy: algo.EntropyControl's fields
    best_value: float | None = None  # checkpoint.best_metric's best value so far, and the step it was measured after
    best_step: int | None = None
    bad_steps_in_a_row: int = 0  # not saved: a checkpoint is never written right after a bad step


class Checkpointer:
    """Saves and restores a TrainState together with the objects it needs (and nothing else)."""

    def __init__(self, output_dir: Path, cfg, *, policy, optimizer, scheduler, stream, tokenizer, dist):
        self.root, self.cfg = Path(output_dir) / "checkpoints", cfg
        self.policy, self.optimizer, self.scheduler = policy, optimizer, scheduler
        self.stream, self.tokenizer, self.dist = stream, tokenizer, dist

    @property
    def _reference_moves(self) -> bool:
        """The frozen reference moves toward the policy (algo.ref_sync_steps): checkpoints keep it."""
        return self.policy.ref_model is not None and self.cfg.algo.ref_sync_steps > 0

    def save_unless_saved(self, state: TrainState) -> Path:
        """The checkpoint of the steps done so far: the newest one when it is of this step already, else a new one."""
        newest = latest_checkpoint(self.root)
        return newest if newest == checkpoint_path(self.root, state.step) else self.save(state)

    def save(self, state: TrainState) -> Path:
        """Rank 0 writes; every rank resumes from what it wrote. FSDP2: every rank first helps
        gather the full weights and optimizer state onto rank 0, which writes them exactly as one
        process would (a checkpoint resumes under any strategy and number of ranks)."""
        path = checkpoint_path(self.root, state.step)
        model = self.policy.peft or self.policy.model  # what save_pretrained writes: the adapter with LoRA
        full = full_model_state(self.dist, model)  # FSDP2: collectives; None otherwise
        full_optim = full_optimizer_state(self.dist, self.policy.model, self.optimizer)
        if not self.dist.is_main:
            self.dist.barrier("checkpoint")
            return path
        saved = {k: v for k, v in asdict(state).items() if k != "bad_steps_in_a_row"}
        saved.update(
            {
                "optimizer": self.optimizer.state_dict() if full_optim is None else full_optim,
                "scheduler": self.scheduler.state_dict(),
                "data": self.stream.state_dict(),
                "rng": rng_state(),
            }
        )
        path = save_checkpoint(
            self.root,
            state.step,
            model=model,
            tokenizer=self.tokenizer,
            trainer_state=saved,
            config=to_dict(self.cfg),
            keep=self.cfg.checkpoint.keep,
            protect=state.best_step,  # the best checkpoint (checkpoint.best_metric) outlives checkpoint.keep
            state_dict=full,
            reference=self.policy.ref_model if self._reference_moves else None,
        )
        self.dist.barrier("checkpoint")
        return path

    def best_checkpoint(self, state: TrainState) -> Path | None:
        """The checkpoint of checkpoint.best_metric's best step, when it was written (not after a bad step)."""
        path = None if state.best_step is None else checkpoint_path(self.root, state.best_step)
        return path if path is not None and (path / COMPLETE_MARKER).exists() else None

    def load_model_weights(self, path: Path) -> None:
        """Checkpoint `path`'s weights (the adapter with LoRA) into the policy, on every rank."""
        policy, model = self.policy, self.policy.model
        if self.dist.strategy == "fsdp":  # every rank reads the whole files and keeps its shard
            if policy.peft is not None:
                load_full_model_state(self.dist, policy.peft, policy.adapter_state_by_name(path), strict=False)
            else:
                load_full_model_state(self.dist, model, read_weights(path))
        else:
            policy.load_adapter_weights(path) if policy.peft is not None else load_weights(path, model)

    def resume(self, where: str, *, force: bool) -> tuple[TrainState, Path] | None:
        """Load the checkpoint `where` names (`auto`: the newest) into the optimizer, scheduler,
        stream, RNG and weights; (its TrainState, its path), or None when there is none yet."""
        path = latest_checkpoint(self.root) if where == "auto" else Path(where)
        if path is None:
            return None  # resume=auto with nothing saved yet: a fresh start
        if not (path / "trainer_state.pt").exists():
            raise FileNotFoundError(f"resume: {path} is not a complete checkpoint (no trainer_state.pt)")
        saved_cfg = complete_saved_config(yaml.safe_load((path / "config.yaml").read_text()))
        changes = math_changes(saved_cfg, to_dict(self.cfg))
        if changes and not force:
            raise ConfigError(
                f"resume: the config differs from checkpoint {path} in settings that change the math:\n  - "
                + "\n  - ".join(changes)
                + f"\nrevert them (`rlvr train --resume {self.root.parent}` resumes with the run's own config.yaml), "
                "or pass --force to resume anyway"
            )
        saved = load_trainer_state(path)
        self.load_model_weights(path)
        if self.dist.strategy == "fsdp":
            load_full_optimizer_state(self.dist, self.policy.model, self.optimizer, saved["optimizer"])
        else:
            self.optimizer.load_state_dict(saved["optimizer"])
        if self._reference_moves:  # else the initial policy (a checkpoint of a run whose reference stayed, resumed with --force)
            load_reference(path, self.policy.ref_model)
        self.scheduler.load_state_dict(saved["scheduler"])
        # the next update's rate from this run's schedule, which `steps` may have changed (the optimizer's state holds the
        # old schedule's); with the same schedule the very value the scheduler computed (a resume is bit for bit)
        for group, base, rate in zip(self.optimizer.param_groups, self.scheduler.base_lrs, self.scheduler.lr_lambdas):
            group["lr"] = base * rate(self.scheduler.last_epoch)
        self.stream.load_state_dict(saved["data"])
        set_rng_state(saved["rng"])
        state = TrainState(
            step=saved["step"],
            num_tokens=saved["num_tokens"],
            skipped_steps=saved.get("skipped_steps", 0),
            train_seconds=saved.get("train_seconds", 0.0),
            eval_before=saved.get("eval_before"),
            entropy_control=saved.get("entropy_control"),
            best_value=saved.get("best_value"),
            best_step=saved.get("best_step"),
        )
        c, was = self.cfg.checkpoint, saved_cfg.get("checkpoint") or {}
        if (was.get("best_metric"), was.get("greater_is_better", True)) != (c.best_metric, c.greater_is_better):
            state.best_value = state.best_step = None  # another measure of "best": the comparison starts over
        return state, path
