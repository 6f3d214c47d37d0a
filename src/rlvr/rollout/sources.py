"""The rollout source a config describes: single-turn, or multi-turn with tools / an environment."""

from __future__ import annotations

import torch

from rlvr.rollout.generation import GenerationEngine, SamplingParams
from rlvr.rollout.single_turn import SingleTurnSource


def make_source(cfg, engine: GenerationEngine, tokenizer, sampling: SamplingParams, *, context_length: int | None,
                device: torch.device, precision: str, tool_runner=None):
    """`cfg` is an rlvr.config.Config; `sampling` its sampling (or greedy, for evaluation); `precision`
    the run's resolved model.autocast, `bf16` or `none` (rlvr.models.precision_choice).
    `tool_runner`: share one rlvr.tools.ToolRunner (its threads) between sources."""
    common = dict(system_prompt=cfg.data.system_prompt, context_length=context_length, autocast=precision, device=device)
    t = cfg.tools
    if cfg.rollout.function:
        from rlvr.rollout.function_source import FunctionSource, load_function

        return FunctionSource(load_function(cfg.rollout.function), engine.model, tokenizer, sampling)
    if not t.enabled:
        return SingleTurnSource(engine, tokenizer, sampling, **common)
    from rlvr.envs import ENVIRONMENTS
    from rlvr.rollout.multi_turn import MultiTurnSource, make_format
    from rlvr.tools import EnvironmentFactory, ToolRunner, ToolSet

    tools = ToolSet(t.functions) if t.functions else None
    env = EnvironmentFactory(ENVIRONMENTS.get(t.environment, t.environment)) if t.environment else None
    if env is not None and not env.has_reward and not cfg.rewards:
        raise ValueError(f"`rewards` is empty and the environment {env.name} has no get_reward(): nothing scores the episodes; "
                         "add a reward function (e.g. rewards: [final_answer])")
    names = (tools.names if tools else []) + (env.names if env else [])
    schemas = (tools.schemas if tools else []) + (env.schemas if env else [])
    fmt = make_format(t.format, tokenizer, tool_names=names, schemas=schemas, tags=dict(p.split("=", 1) for p in t.tags),
                      result_tags=tuple(t.result_tags))
    runner = tool_runner or ToolRunner(timeout_s=t.timeout_s, max_result_chars=t.max_result_chars)
    return MultiTurnSource(engine, tokenizer, sampling, fmt=fmt, tools=tools, environment=env, runner=runner,
                           max_turns=t.max_turns, **common)
