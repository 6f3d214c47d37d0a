"""Configuration: the schema (typed dataclasses, a docstring per field), loading (YAML + dotted
overrides) and validation that names the field and a value that works. Imports nothing from the
rest of rlvr."""

from rlvr.config.load import describe, field_docs, load_config, old_names, to_dict
from rlvr.config.renamed import RENAMED, upgrade
from rlvr.config.schema import (
    AlgoConfig,
    CheckpointConfig,
    Config,
    ConfigError,
    DataConfig,
    DistConfig,
    EvalConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    ToolsConfig,
    VllmConfig,
)
from rlvr.config.trl_names import TRL_NAMES, trl_hint, trl_table
from rlvr.config.validate import REGISTERED, batch_split_errors, validate
from rlvr.config.validate_rollout import applied_sampler_correction, sampler_is_trainer

__all__ = [
    "AlgoConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DistConfig",
    "EvalConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "REGISTERED",
    "RENAMED",
    "RewardConfig",
    "RolloutConfig",
    "TRL_NAMES",
    "ToolsConfig",
    "VllmConfig",
    "applied_sampler_correction",
    "sampler_is_trainer",
    "batch_split_errors",
    "describe",
    "field_docs",
    "load_config",
    "old_names",
    "to_dict",
    "trl_hint",
    "trl_table",
    "upgrade",
    "validate",
]
