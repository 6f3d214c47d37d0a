"""Rollout sources: what makes a batch's Episodes (rlvr.rollout.episodes.RolloutSource) from dataset rows.

single_turn.py  SingleTurnSource: one model turn per episode, on any GenerationEngine
multi_turn.py   MultiTurnSource: turns that call tools or act in an environment, on a MultiTurnEngine
function.py     FunctionSource: a user's rollout function (TRL's rollout_func)
agent/          AgentSource: a user's agent against an OpenAI-compatible endpoint of the policy (see its __init__)
agent/          outside agents: an OpenAI-compatible endpoint that records each episode's calls token-exactly
__init__.py     make_source: the source a config describes
"""

from __future__ import annotations

import torch

from rlvr.config import ConfigError
from rlvr.rollout.engines.protocols import GenerationEngine, SamplingParams
from rlvr.rollout.sources.single_turn import SingleTurnSource
from rlvr.specs import did_you_mean


def make_source(
    cfg,
    engine: GenerationEngine,
    tokenizer,
    sampling: SamplingParams,
    *,
    context_length: int | None,
    device: torch.device,
    precision: str,
    tool_runner=None,
):
    """`cfg` is an rlvr.config.Config; `sampling` its sampling (or greedy, for evaluation); `precision`
    the run's resolved model.autocast, `bf16` or `none` (rlvr.models.precision_choice).
    `tool_runner`: share one rlvr.tools.ToolRunner (its threads) between sources."""
    common = dict(system_prompt=cfg.data.system_prompt, context_length=context_length, autocast=precision, device=device)
    t = cfg.tools
    if cfg.rollout.agent:
        return _agent_source(cfg, engine, tokenizer, sampling, context_length)
    if cfg.rollout.function:
        from rlvr.rollout.sources.function import FunctionSource, load_function

        return FunctionSource(load_function(cfg.rollout.function), engine, tokenizer, sampling)
    if not t.enabled:
        return SingleTurnSource(engine, tokenizer, sampling, **common)
    from rlvr.rollout.sources.multi_turn import MultiTurnSource

    tools, env = _tools_and_environment(cfg)
    fmt, kind, note = _tool_format(cfg, tokenizer, tools, env)
    runner = tool_runner or _tool_runner(t)
    source = MultiTurnSource(
        engine, tokenizer, sampling, fmt=fmt, tools=tools, environment=env, runner=runner, max_turns=t.max_turns, **common
    )
    source.notes = ([note] if note else []) + unused_with_format(t, kind)
    return source


def _agent_source(cfg, engine, tokenizer, sampling: SamplingParams, context_length: int | None):
    """`rollout.agent`: its endpoint samples with the run's engine (token-id prompts), or on its generation servers."""
    from rlvr.rollout.engines.remote.engine import RemoteEngine
    from rlvr.rollout.sources.agent import engine_sampler
    from rlvr.rollout.sources.agent.source import AgentSource
    from rlvr.specs import resolve

    fn = resolve(cfg.rollout.agent.strip(), setting="rollout.agent", spec=cfg.rollout.agent)
    sampler = engine.sample if isinstance(engine, RemoteEngine) else engine_sampler(engine, tokenizer)
    return AgentSource(
        fn, engine, tokenizer, sampling, sampler=sampler, timeout=cfg.rollout.agent_timeout, context_length=context_length,
        system_prompt=cfg.data.system_prompt, tags=agent_tags(cfg.tools), decoder=_continuous_decoder(engine, tokenizer),
    )  # fmt: skip


def agent_tags(t):
    """The tag protocol an agent's endpoint speaks (`t`: a ToolsConfig): with tools.format=tags, else None."""
    from rlvr.rollout.sources.agent.tags import TagSettings

    if t.format != "tags":
        return None
    pairs = (p.split("=", 1) for p in t.tags)
    return TagSettings({name.strip(): tag.strip() for name, tag in pairs}, tuple(t.result_tags), t.describe)


def _continuous_decoder(engine, tokenizer):
    """The hf engine's continuous decoder (token-level batching, an agent's history never prefilled again) for models with
    plain full causal attention; None: the endpoint batches whole requests on `engine.generate`."""
    from rlvr.rollout.engines.hf import HFEngine
    from rlvr.rollout.engines.hf.continuous import ContinuousDecoder
    from rlvr.rollout.engines.hf.shared_prefix import supports_shared_prefix
    from rlvr.rollout.engines.turns import eos_ids

    if not isinstance(engine, HFEngine) or not supports_shared_prefix(engine.model.config):
        return None
    eos = eos_ids(engine.model, tokenizer)
    # decoded on the thread that runs the agents (AgentSource drives it): the trainer's main thread
    return lambda: ContinuousDecoder(engine.model, tokenizer, eos=eos, merge_lora=engine.merge_lora, own_thread=False)


def _tools_and_environment(cfg):
    """The run's tool set and environment factory (either may be None); an error when nothing can score an episode."""
    from rlvr.tasks import ENVIRONMENTS
    from rlvr.tools import EnvironmentFactory, ToolSet

    t = cfg.tools
    tools = ToolSet(t.functions) if t.functions else None
    env = EnvironmentFactory(ENVIRONMENTS.get(t.environment, t.environment)) if t.environment else None
    if env is not None and not env.has_reward and not cfg.rewards:
        raise ValueError(
            f"`rewards` is empty and the environment {env.name} has no get_reward(): nothing scores the episodes; "
            "add a reward function (e.g. rewards: [final_answer])"
        )
    return tools, env


def _tool_format(cfg, tokenizer, tools, env):
    """(the tool format, its kind, the note saying how tools.format=auto chose it or None)."""
    from rlvr.rollout.sources.multi_turn import make_format
    from rlvr.tools import choose_format

    t = cfg.tools
    names = (tools.names if tools else []) + (env.names if env else [])
    schemas = (tools.schemas if tools else []) + (env.schemas if env else [])
    kind, note = choose_format(t.format, tokenizer, cfg.model.path)
    fmt = make_format(
        kind,
        tokenizer,
        tool_names=names,
        schemas=schemas,
        tags=tag_map(t.tags, names),
        result_tags=tuple(t.result_tags),
        describe=t.describe,
        model=cfg.model.path,
    )
    return fmt, kind, note


def _tool_runner(t):
    from rlvr.tools import ToolRunner

    return ToolRunner(timeout_s=t.timeout_s, max_result_chars=t.max_result_chars)


def tag_map(pairs: list[str], names: list[str]) -> dict[str, str]:
    """`tools.tags` as {tool: tag}; ConfigError (with the nearest name) for a pair naming no tool of the run."""
    tags = {name.strip(): tag.strip() for name, tag in (p.split("=", 1) for p in pairs)}
    unknown = [n for n in tags if n not in names]
    if unknown:
        listed = "; ".join(f"{n}={tags[n]}{did_you_mean(n, names)}" for n in unknown)
        raise ConfigError(
            f"`tools.tags` names {'a tool' if len(unknown) == 1 else 'tools'} this run does not have: {listed}; "
            f"its tools are {', '.join(names) or 'none'}"
        )
    return tags


def unused_with_format(t, kind: str) -> list[str]:
    """Warnings for the tags format's settings when the chosen format is the chat template's (`t`: a ToolsConfig)."""
    if kind != "chat_template":
        return []
    why = f"with tools.format={t.format}" + (" (which chose chat_template)" if t.format == "auto" else "")
    defaults, out = type(t)(), []
    for key in ("tags", "result_tags"):
        if getattr(t, key) != getattr(defaults, key):
            out.append(f"tools.{key} has no effect {why}: the model calls tools in its chat template's format")
    if not t.describe:
        out.append(f"tools.describe=false has no effect {why}: the chat template shows the tools itself")
    return out
