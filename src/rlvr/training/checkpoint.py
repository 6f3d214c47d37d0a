"""Checkpoints: written whole or not at all, and enough state to resume exactly.

A checkpoint folder holds the model (save_pretrained) and tokenizer, `trainer_state.pt`
(optimizer, scheduler, step, data position, RNG states) and the resolved `config.yaml`.
It is written under a temporary name, fsynced, then renamed: a crash mid-write leaves the
previous checkpoint as the newest complete one.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from rlvr.config import upgrade

COMPLETE_MARKER = "COMPLETE"


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with p.open("rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_path(root: Path, step: int) -> Path:
    """Where the checkpoint of step `step` lives under `root` (checkpoints/step-0000012)."""
    return root / f"step-{step:07d}"


def save_checkpoint(
    root: Path,
    step: int,
    *,
    model,
    tokenizer,
    trainer_state: dict,
    config: dict,
    keep: int = 2,
    protect: int | None = None,
    state_dict: dict | None = None,
    reference=None,
) -> Path:
    """`state_dict`: the model's full weights when its parameters are FSDP2 shards (gathered by
    `rlvr.dist.full_model_state`); written exactly as `model.save_pretrained` writes an unsharded model.
    `reference`: a reference model that moved during training (algo.ref_sync_steps), written to reference/.
    `keep`: how many of the newest checkpoints stay (0: all), besides step `protect`'s (the best one)."""
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(root, step)
    tmp = root / f".tmp-step-{step:07d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model.save_pretrained(tmp) if state_dict is None else model.save_pretrained(tmp, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    if reference is not None:  # in a folder of its own: the checkpoint's own *.safetensors are the policy's weights
        save_reference(tmp, reference)
    torch.save(trainer_state, tmp / "trainer_state.pt")
    (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (tmp / COMPLETE_MARKER).write_text(str(step))
    _fsync_tree(tmp)
    hook = os.environ.get("RLVR_TEST_PAUSE_BEFORE_RENAME", "")  # "STEP:FILE", for a kill -9 mid-write
    if hook.split(":", 1)[0] == str(step):
        Path(hook.split(":", 1)[1]).write_text(str(step))
        time.sleep(60)
    old = root / f".old-step-{step:07d}"
    if final.exists():  # the same step written again: the old one stays whole until the new one is in place
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_tree(root)
    shutil.rmtree(old, ignore_errors=True)
    for old in complete_checkpoints(root)[:-keep] if keep > 0 else []:
        if protect is None or old != checkpoint_path(root, protect):
            shutil.rmtree(old, ignore_errors=True)
    return final


def remove_partial_checkpoints(root: Path) -> list[Path]:
    """Delete temporary folders left by a write that was killed (they were never complete); a checkpoint
    that was being replaced by one of the same step goes back in place if the new one never arrived."""
    if not root.is_dir():
        return []
    for old in sorted(root.glob(".old-step-*")):
        current = root / old.name[len(".old-") :]
        if current.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(old, current)
    stale = sorted(root.glob(".tmp-step-*"))
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


def complete_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if (p / COMPLETE_MARKER).exists()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(root: Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def load_trainer_state(path: Path) -> dict:
    return torch.load(path / "trainer_state.pt", weights_only=False)


def read_weights(path: Path) -> dict:
    """A checkpoint's full model weights (every *.safetensors file in it), on CPU."""
    from safetensors.torch import load_file

    weights = {}
    for f in sorted(path.glob("*.safetensors")):
        weights.update(load_file(f))
    return weights


def save_reference(path: Path, reference) -> None:
    """The reference model's weights in checkpoint `path` (reference/model.safetensors; tied weights once)."""
    from safetensors.torch import save_model

    (path / REFERENCE).parent.mkdir()
    save_model(reference, str(path / REFERENCE))


def load_reference(path: Path, reference) -> bool:
    """The reference weights checkpoint `path` holds, into `reference` in place; False when it holds none (saved by a
    run whose reference never moved)."""
    from safetensors.torch import load_model

    if not (path / REFERENCE).exists():
        return False
    missing, unexpected = load_model(reference, str(path / REFERENCE), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"resume: {path / REFERENCE} does not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return True


def load_weights(path: Path, model) -> None:
    """Load a checkpoint's safetensors into `model` in place (tied weights re-tied)."""
    weights = read_weights(path)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or any("lm_head" not in k for k in missing):
        raise RuntimeError(f"resume: checkpoint {path} does not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()


REFERENCE = "reference/model.safetensors"  # a checkpoint's moved reference (algo.ref_sync_steps)

# Settings that may change between a run and its resumption: they do not change the math.
RESUMABLE_CHANGES = {
    "steps",
    "output_dir",
    "resume",
    "device",
    "threads",
    "keep_cpu_memory",
    "flush_denormals",  # values below 1.2e-38 read as 0: below the rounding of every sum that holds a normal number
    "max_bad_steps",
    "max_failed_reward_steps",
    "checkpoint",
    "logging",  # when checkpoints are written, what is logged where
    "eval",  # what is evaluated, and when: not what is trained
    # Scale-out: the update equals one process doing the whole batch, whatever the ranks.
    "nproc",
    "dist.strategy",
    "dist.backend",
    "dist.timeout",
    "model.gradient_checkpointing",
    "model.lora.save_merged",
    "model.lora.merge_for_generation",  # the same samples up to rounding
    # vLLM's memory and start-up knobs: same samples, same update.
    "rollout.vllm.gpu_memory_utilization",
    "rollout.vllm.sleep",
    "rollout.vllm.max_model_len",
    "rollout.vllm.enforce_eager",
    # Where generation runs and how weights reach it (k = 0: the same samples as in-process; a restart's servers
    # have new addresses). rollout.max_staleness is not here: rows k versions old are a different update.
    "rollout.servers",
    "rollout.weight_sync",
    "rollout.weight_dir",
    "rollout.trainer_host",
    "rollout.server_timeout_s",
}


# Fields added after runs were written whose default changes what a run does: a saved config without one ran
# with this value, and resumes with it (every other field it lacks ran as today's default). Each applies only
# where its setting matters (`tools.describe`: a run with tools).
OLD_RUN_VALUES = {
    "tools.describe": (
        False,
        lambda saved: bool((saved.get("tools") or {}).get("functions")) or (saved.get("tools") or {}).get("environment") is not None,
    )
}


def _lacks(tree: dict, dotted: str) -> bool:
    *parents, leaf = dotted.split(".")
    node: object = tree
    for key in parents:
        node = node.get(key) if isinstance(node, dict) else None
    return not isinstance(node, dict) or leaf not in node


def old_run_overrides(saved: dict) -> list[str]:
    """`key=value` overrides that make a config.yaml written before OLD_RUN_VALUES's fields existed run as it ran."""
    saved = upgrade(saved)  # keys that have moved since, at their places now
    return [
        f"{key}={str(value).lower() if isinstance(value, bool) else value}"
        for key, (value, applies) in OLD_RUN_VALUES.items()
        if _lacks(saved, key) and applies(saved)
    ]


def complete_saved_config(saved: dict) -> dict:
    """A checkpoint's config.yaml with its moved keys at their places now (rlvr.config.renamed) and every field it
    lacks filled (OLD_RUN_VALUES, else today's default), so neither a field added since it was written nor one
    that moved is mistaken for a change of the math."""
    from rlvr.config import load_config, to_dict

    return _fill(upgrade(saved), to_dict(load_config(None, old_run_overrides(saved))))


def _fill(saved: dict, defaults: dict) -> dict:
    out = dict(defaults)
    for key, value in saved.items():
        out[key] = _fill(value, defaults[key]) if isinstance(value, dict) and isinstance(defaults.get(key), dict) else value
    return out


def math_changes(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose value differs between two configs, ignoring RESUMABLE_CHANGES."""
    changed = []
    for key in sorted(set(saved) | set(current)):
        dotted = prefix + key
        if dotted in RESUMABLE_CHANGES:
            continue
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changed += math_changes(a, b, dotted + ".")
        elif a != b:
            changed.append(f"{dotted}: {a!r} -> {b!r}")
    return changed
