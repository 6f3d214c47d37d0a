"""Validation of algo.*: the registered names, the clipping and sampling hyperparameters, the TRL loss types'
own, the moving reference. Part of rlvr.config.validate, which collects every error."""

from __future__ import annotations

import math
from typing import Callable, Collection, Mapping

from rlvr.config.schema import Config

Choice = Callable[[str, object, Collection[str]], None]  # as in rlvr.config.validate


def validate_algo(cfg: Config, errors: list[str], warnings: list[str], choice: Choice, choices: Mapping[str, Collection[str]]) -> None:
    """algo.*: the registered names, the clipping and sampling hyperparameters, the objectives' own."""
    a = cfg.algo
    choice("algo.sampler_correction", a.sampler_correction, ["auto", "none", *choices["algo.sampler_correction"]])
    if not a.sampler_correction_cap > 1:
        errors.append(f"`algo.sampler_correction_cap` must be > 1, got {a.sampler_correction_cap}")
    if a.sampler_correction_min is not None and not 0 <= a.sampler_correction_min < a.sampler_correction_cap:
        errors.append(f"`algo.sampler_correction_min` must be in [0, algo.sampler_correction_cap) or null, got {a.sampler_correction_min}")
    for key in ("algo.loss_type", "algo.importance_sampling_level", "algo.kl_estimator", "algo.scale_rewards", "algo.reward_aggregation"):
        choice(key, getattr(a, key.split(".", 1)[1]), choices[key])
    if not 0 < a.epsilon < 1:
        errors.append(f"`algo.epsilon` must be in (0, 1), got {a.epsilon}")
    if a.epsilon_high is not None and a.epsilon_high <= 0:
        errors.append(f"`algo.epsilon_high` must be positive, got {a.epsilon_high}")
    if a.delta is not None and a.delta <= 1:
        errors.append(f"`algo.delta` must be > 1 (it caps the ratio), got {a.delta}")
    if a.num_iterations < 1:
        errors.append(f"`algo.num_iterations` must be >= 1, got {a.num_iterations}")
    if a.beta < 0:
        errors.append(f"`algo.beta` must be >= 0, got {a.beta}")
    _validate_ref_sync(cfg, errors)
    if a.std_ddof not in (0, 1):
        errors.append(f"`algo.std_ddof` must be 0 or 1, got {a.std_ddof}")
    if not a.std_eps >= 0:
        errors.append(f"`algo.std_eps` must be >= 0, got {a.std_eps}")
    if not 0 < a.top_entropy_quantile <= 1:
        errors.append(f"`algo.top_entropy_quantile` must be in (0, 1], got {a.top_entropy_quantile}")
    _validate_objectives(cfg, errors, warnings)
    if a.max_resample_rounds < 0:
        errors.append(f"`algo.max_resample_rounds` must be >= 0, got {a.max_resample_rounds}")


def _validate_objectives(cfg: Config, errors: list[str], warnings: list[str]) -> None:
    """The hyperparameters of the TRL loss types beyond the clipped one, the entropy bonus and OPSM."""
    a = cfg.algo
    if a.loss_type == "cispo" and (a.epsilon_high is None or a.epsilon_high <= 1):
        errors.append(
            f"`algo.loss_type`=cispo caps the importance weight at algo.epsilon_high itself (not 1 + epsilon_high), "
            f"got {a.epsilon_high}: set algo.epsilon_high above 1, e.g. 5.0 (ScaleRL, TRL's recommendation)"
        )
    for name in ("sapo_temperature_pos", "sapo_temperature_neg", "vespo_lambda_pos", "vespo_lambda_neg"):
        if getattr(a, name) <= 0:
            errors.append(f"`algo.{name}` must be positive, got {getattr(a, name)} (default {getattr(type(a)(), name)})")
    for name in ("vespo_k_pos", "vespo_k_neg"):
        if getattr(a, name) < 0:
            errors.append(f"`algo.{name}` must be >= 0, got {getattr(a, name)} (default {getattr(type(a)(), name)})")
    if not math.isfinite(a.entropy_coef):
        errors.append(f"`algo.entropy_coef` must be a finite number (0 = off, e.g. 0.001), got {a.entropy_coef}")
    for name in ("clip_cov_ratio", "kl_cov_ratio"):
        if not 0 <= getattr(a, name) < 1:
            errors.append(f"`algo.{name}` must be a share of the tokens in [0, 1) (0 = off; the paper: 2e-4), got {getattr(a, name)}")
    if a.clip_cov_ratio > 0 and a.kl_cov_ratio > 0:
        errors.append(
            "`algo.clip_cov_ratio` and `algo.kl_cov_ratio` are two remedies for one thing: set one of them (the other 0; "
            f"Clip-Cov is on by default, at {type(a)().clip_cov_ratio}: KL-Cov needs algo.clip_cov_ratio=0)"
        )
    if a.clip_cov_ratio > 0 and not a.clip_cov_lb < a.clip_cov_ub:
        errors.append(f"`algo.clip_cov_lb` must be below `algo.clip_cov_ub`, got {a.clip_cov_lb} and {a.clip_cov_ub}")
    if a.adaptive_entropy and not (a.entropy_coef_min <= a.entropy_coef_max and a.entropy_coef_delta >= 0 and (a.entropy_target or 0) >= 0):
        errors.append(
            f"`algo.adaptive_entropy`: needs entropy_coef_min <= entropy_coef_max (got {a.entropy_coef_min}, {a.entropy_coef_max}), "
            f"entropy_coef_delta >= 0 (got {a.entropy_coef_delta}) and entropy_target >= 0 nats (got {a.entropy_target})"
        )
    if a.off_policy_mask_threshold is not None and not a.off_policy_mask_threshold > 0:
        errors.append(f"`algo.off_policy_mask_threshold` must be positive (e.g. 0.5) or null (off), got {a.off_policy_mask_threshold}")
    if a.loss_type == "luspo" and a.importance_sampling_level != "sequence":
        warnings.append(
            "algo.loss_type=luspo with token-level ratios: LUSPO's paper (and TRL's warning) uses algo.importance_sampling_level=sequence"
        )
    if a.loss_type == "vespo" and a.importance_sampling_level != "token":
        warnings.append(
            "algo.loss_type=vespo forms its own sequence weight: algo.importance_sampling_level=sequence only changes "
            "the KL bias correction's ratio; TRL expects token"
        )
    if a.loss_type == "vespo" and a.sampler_correction.startswith("sequence"):
        errors.append(
            f"algo.loss_type=vespo folds each token's sampler-correction weight into its own: algo.sampler_correction="
            f"{a.sampler_correction} gives one per completion; use token_truncate or token_mask (TRL refuses it too)"
        )
    if a.kl_bias_correction and a.beta == 0:
        warnings.append("algo.kl_bias_correction=true has no effect without a KL term (algo.beta=0)")


def _validate_ref_sync(cfg: Config, errors: list[str]) -> None:
    """algo.ref_sync_steps: the frozen reference copy moves toward the policy (a full fine-tune on one process or DDP)."""
    a = cfg.algo
    if a.ref_sync_steps < 0:
        errors.append(f"`algo.ref_sync_steps` must be >= 0 (0: the reference stays the initial policy), got {a.ref_sync_steps}")
    if not 0 < a.ref_sync_alpha <= 1:
        errors.append(f"`algo.ref_sync_alpha` must be in (0, 1], got {a.ref_sync_alpha}")
    if a.ref_sync_steps > 0 and a.beta > 0:
        if cfg.model.lora.r > 0:
            errors.append(
                "`algo.ref_sync_steps` moves a frozen copy of the model; with LoRA (model.lora.r > 0) the reference is the base "
                "model with the adapter off, which training never changes (TRL refuses sync_ref_model with PEFT too): set it to 0 "
                "(in a GRPOConfig: sync_ref_model=False)"
            )
        if cfg.dist.strategy == "fsdp" and cfg.nproc > 1:
            errors.append("`algo.ref_sync_steps` is not implemented with dist.strategy=fsdp (the policy is sharded): use ddp")
