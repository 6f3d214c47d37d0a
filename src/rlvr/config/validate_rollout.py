"""Validation of rollout.*: the group and sampling settings, the engine (and vLLM's own settings), generation
servers and asynchronous steps, an outside agent. Part of rlvr.config.validate, which collects every error."""

from __future__ import annotations

from typing import Callable, Collection

from rlvr.config.schema import Config

Choice = Callable[[str, object, Collection[str]], None]  # as in rlvr.config.validate


def validate_rollout(cfg: Config, errors: list[str], warnings: list[str], choice: Choice, engines: Collection[str], force: bool) -> None:
    """rollout.*: the group, the sampling settings, the engine (and vLLM's own settings)."""
    r = cfg.rollout
    if r.group_size < 2:
        errors.append(
            f"`rollout.group_size` must be at least 2 (got {r.group_size}): one completion per prompt has no group to compare with"
        )
    elif r.group_size == 2:
        warnings.append("rollout.group_size=2: every difference, even grader noise, becomes a full +1/-1 advantage; 4-16 is usual")
    if r.prompts_per_step < 1:
        errors.append(f"`rollout.prompts_per_step` must be at least 1, got {r.prompts_per_step}")
    if r.max_new_tokens <= 0:
        errors.append(f"`rollout.max_new_tokens` must be positive, got {r.max_new_tokens}")
    if r.temperature < 0:
        errors.append(f"`rollout.temperature` must be >= 0, got {r.temperature}")
    elif r.temperature == 0 and not force:
        errors.append("`rollout.temperature` is 0: all G completions of a prompt would be identical (no signal); use e.g. 1.0")
    if not 0 < r.top_p <= 1:
        errors.append(f"`rollout.top_p` must be in (0, 1], got {r.top_p}")
    if r.top_k < 0:
        errors.append(f"`rollout.top_k` must be >= 0, got {r.top_k}")
    if not 0 <= r.min_p <= 1:
        errors.append(f"`rollout.min_p` must be in [0, 1], got {r.min_p}")
    if not r.repetition_penalty > 0:
        errors.append(f"`rollout.repetition_penalty` must be positive (1: off), got {r.repetition_penalty}")
    elif r.repetition_penalty != 1 and (r.agent or r.function):
        errors.append(
            "`rollout.repetition_penalty` applies to rlvr's own generation (the hf engine, vLLM, generation servers); an agent "
            "or a rollout function samples its own way"
        )
    choice("rollout.engine", r.engine, engines)
    choice("rollout.compile", r.compile, ["on", "off"])
    if r.compile == "on" and r.engine == "vllm":
        errors.append("`rollout.compile`=on compiles the hf engine's decode; vLLM compiles its own: set rollout.compile=off")
    _validate_servers(cfg, errors, choice)
    _validate_agent(cfg, errors)
    if r.engine != "vllm":
        return
    v = r.vllm
    if not 0 < v.gpu_memory_utilization <= 1:
        errors.append(f"`rollout.vllm.gpu_memory_utilization` must be in (0, 1], got {v.gpu_memory_utilization}")
    if v.max_model_len is not None and v.max_model_len <= r.max_new_tokens:
        errors.append(
            f"`rollout.vllm.max_model_len`={v.max_model_len} leaves no room for prompts: "
            f"it must exceed rollout.max_new_tokens={r.max_new_tokens}"
        )
    choice("rollout.vllm.dtype", v.dtype, ["auto", "float32", "bfloat16", "float16"])
    if cfg.model.gguf_file:
        errors.append(
            "`rollout.engine`=vllm loads a Hugging Face folder: "
            "convert the GGUF once with `rlvr convert-gguf` and point model.path at the result"
        )
    if cfg.nproc > 1 and cfg.dist.strategy == "fsdp":
        errors.append(
            "`rollout.engine`=vllm with dist.strategy=fsdp is not supported (each rank's vLLM needs the full weights): "
            "use ddp, or engine=hf"
        )


def _validate_servers(cfg: Config, errors: list[str], choice: Choice) -> None:
    """rollout.servers and what goes with them: asynchronous steps, the weight sync."""
    r = cfg.rollout
    for url in r.servers:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url.split("//", 1)[1].strip("/")) == 0:
            errors.append(f"`rollout.servers`: {url!r} is not a URL; give e.g. http://127.0.0.1:8000")
    if len(set(r.servers)) != len(r.servers):
        errors.append(f"`rollout.servers` lists a server twice: {r.servers}")
    if r.max_staleness < 0:
        errors.append(f"`rollout.max_staleness` must be >= 0 (0: synchronous), got {r.max_staleness}")
    choice("rollout.weight_sync", r.weight_sync, ["distributed", "filesystem"])
    if r.weight_sync == "filesystem" and not r.weight_dir:
        errors.append("`rollout.weight_sync`=filesystem needs `rollout.weight_dir`: a folder the trainer and every server see")
    if r.server_timeout_s <= 0:
        errors.append(f"`rollout.server_timeout_s` must be positive, got {r.server_timeout_s}")
    if (r.servers or r.max_staleness) and r.engine == "vllm":
        errors.append(
            "`rollout.engine`=vllm is the colocated engine; with rollout.servers (or max_staleness > 0) generation runs in the "
            "servers: start them with `rlvr serve MODEL --engine vllm` and leave rollout.engine=hf"
        )


def _validate_agent(cfg: Config, errors: list[str]) -> None:
    r = cfg.rollout
    if not r.agent:
        return
    if cfg.tools.enabled or r.function:
        errors.append("`rollout.agent` runs the episodes itself: it cannot be combined with `tools` or `rollout.function`")
    if r.engine == "vllm" and not r.servers:
        errors.append("`rollout.agent` with vLLM needs vLLM's server: `rlvr serve MODEL --engine vllm` and rollout.servers=[URL]")
    if r.agent_timeout <= 0:
        errors.append(f"`rollout.agent_timeout` must be positive, got {r.agent_timeout}")
    if cfg.tools.format == "tags" and not cfg.tools.tags:
        errors.append(
            "`rollout.agent` with tools.format=tags needs tools.tags: the tag of each tool the agent offers, e.g. "
            "tools.tags=[calculator=calc] (the model writes <calc>12*34</calc>; the agent gets a `calculator` tool call)"
        )


def applied_sampler_correction(cfg: Config) -> str:
    """algo.sampler_correction as it applies: `auto` resolved for the engine in use (token_truncate with vllm, with
    generation servers and with rollout.max_staleness > 0; none with the in-process hf engine, whose sampler is the
    trained model itself)."""
    if cfg.algo.sampler_correction != "auto":
        return cfg.algo.sampler_correction
    return "none" if sampler_is_trainer(cfg) else "token_truncate"


def sampler_is_trainer(cfg: Config) -> bool:
    """The sampler is the trained model itself, at this step's weights: the in-process hf engine, not another engine's
    probabilities (vLLM) nor weights that may be older than the trained ones (servers, rollout.max_staleness > 0)."""
    r = cfg.rollout
    return r.engine != "vllm" and not r.servers and r.max_staleness == 0
