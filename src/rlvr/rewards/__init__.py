"""Reward functions: TRL's signature, loaded by name, run together with weights.

A reward function is `fn(prompts, completions, **columns) -> list[float | None]`: dataset
columns arrive as keyword arguments (plus `completion_ids`), and None means "not applicable
to this sample". Functions are named in config as a built-in name, `module:function`, or
`path/to/file.py:function`. Reward *factories* (built-in: math, code, code_lint, overlong,
length, test_writing, judge) take parameters in the name, as Python literals:
`fn: "overlong(max_length=512, buffer=128)"`; a bare factory name uses its defaults.

`RewardRunner` (`rlvr.rewards.runner`) runs them together, bounded in time, with TRL's whole
calling contract (`trainer_state`, `log_metric`, `log_extra`), and isolates failures.
"""

from __future__ import annotations

from rlvr.rewards.loading import BUILTIN, RewardError, builtin_rewards, load_reward_fn
from rlvr.rewards.runner import DEFAULT_TIMEOUT_S, RewardFn, RewardRunner, TrainerState

__all__ = ["BUILTIN", "DEFAULT_TIMEOUT_S", "RewardError", "RewardFn", "RewardRunner", "TrainerState", "builtin_rewards", "load_reward_fn"]
