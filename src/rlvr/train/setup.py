"""Checking a config against everything rlvr provides, before any compute is spent, and
resolving what depends on the machine.

rlvr.config validates fields alone (it imports nothing above it); the valid names of settings
that other packages define (loss types, objectives, estimators, engines, tasks) come from their
registries here, and so do the warnings that need the machine (bf16 on this CPU). `run_precision`
resolves model.autocast once the model is loaded.
"""

from __future__ import annotations

import torch

from rlvr import algo
from rlvr.config import Config, validate
from rlvr.config.no_effect import changed
from rlvr.data import render_prompt
from rlvr.dist import Dist
from rlvr.models.precision import cpu_has_fast_bf16
from rlvr.models.precision_choice import PrecisionChoice, choose_precision
from rlvr.models.precision_timing import StepShapes
from rlvr.rollout.engines import ENGINES
from rlvr.tasks import training_tasks
from rlvr.train.batch_plan import BatchPlan


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
        "data.task": training_tasks(),
    }


def unused_objective_settings(cfg: Config) -> list[str]:
    """Changed hyperparameters of objectives that algo.loss_type does not use (sapo_* with dapo, epsilon with vespo, ...)."""
    users: dict[str, list[str]] = {}
    for loss_type, (objective, _) in algo.LOSS_TYPES.items():
        for name in algo.OBJECTIVES[objective].hyperparameters:
            users.setdefault(name, []).append(loss_type)
    used = algo.OBJECTIVES[algo.LOSS_TYPES[cfg.algo.loss_type].objective].hyperparameters
    names = [n for n in users if hasattr(cfg.algo, n) and n not in used]
    return [f"algo.{n}={getattr(cfg.algo, n)} has no effect: algo.loss_type={cfg.algo.loss_type} does not use it "
            f"(used by: {', '.join(users[n])})" for n in changed(cfg.algo, names)]


def check_config(cfg: Config, *, force: bool = False) -> list[str]:
    """Raise ConfigError naming every invalid setting; return the warnings to print."""
    warnings = validate(cfg, choices=registered_choices(), force=force)
    if cfg.algo.loss_type in algo.LOSS_TYPES:
        warnings += unused_objective_settings(cfg)
    if cfg.model.autocast == "bf16" and cfg.device != "cuda" and not cpu_has_fast_bf16():
        warnings.append("model.autocast=bf16 on a CPU without avx512_bf16/AMX: bf16 matmuls are emulated there and usually slower than fp32")
    return warnings


def prompt_tokens(row: dict, tokenizer, system_prompt: str | None) -> int:
    """Tokens of a training row's prompt as the model sees it (the plan's and the precision timing's prompt length)."""
    return len(tokenizer(render_prompt(row["prompt"], tokenizer, system_prompt), add_special_tokens=False)["input_ids"])


def run_precision(cfg: Config, plan: BatchPlan, model, device: torch.device, dist: Dist) -> PrecisionChoice:
    """model.autocast resolved for the run (`auto` timed on rank 0 at this rank's step shapes;
    rlvr.models.precision_choice); every rank takes rank 0's choice. Before the model is wrapped:
    the timing runs forward+backward passes on this rank alone."""
    rows = plan.completions_per_rank
    shapes = StepShapes(rows_per_backward=min(plan.micro_batch_size, rows), trained_rows=rows * cfg.algo.num_iterations,
                        prompt_tokens=plan.seq_len - plan.completion_len, completion_tokens=plan.completion_len,
                        decoded_rows=0 if cfg.rollout.engine == "vllm" else rows)  # vLLM decodes in its own dtype
    choice = choose_precision(cfg.model.autocast, model, device, shapes) if dist.is_main else None
    return dist.all_gather_object(choice, what="model.autocast")[0]
