"""Checking a config against everything rlvr provides, before any compute is spent.

rlvr.config validates fields alone (it imports nothing above it); the valid names of settings
that other packages define (loss types, objectives, estimators, engines, tasks) come from their
registries here, and so do the warnings that need the machine (bf16 on this CPU).
"""

from __future__ import annotations

from rlvr import algo
from rlvr.config import Config, validate
from rlvr.data import TASKS
from rlvr.models.precision import cpu_has_fast_bf16
from rlvr.rollout.engines import ENGINES


def registered_choices() -> dict[str, list[str]]:
    """The valid values of every setting in rlvr.config.REGISTERED, from the registries that define them."""
    return {
        "algo.loss_type": list(algo.LOSS_TYPES),
        "algo.importance_sampling_level": list(algo.IMPORTANCE_LEVELS),
        "algo.kl_estimator": list(algo.KL_ESTIMATORS),
        "algo.scale_rewards": list(algo.ADVANTAGE_SCALES),
        "algo.reward_aggregation": list(algo.REWARD_AGGREGATIONS),
        "algo.sampler_correction": list(algo.SAMPLER_CORRECTIONS),
        "rollout.engine": list(ENGINES),
        "data.task": list(TASKS),
    }


def check_config(cfg: Config, *, force: bool = False) -> list[str]:
    """Raise ConfigError naming every invalid setting; return the warnings to print."""
    warnings = validate(cfg, choices=registered_choices(), force=force)
    if cfg.model.autocast == "bf16" and cfg.device != "cuda" and not cpu_has_fast_bf16():
        warnings.append("model.autocast=bf16 on a CPU without avx512_bf16/AMX: bf16 matmuls are emulated there and usually slower than fp32")
    return warnings
