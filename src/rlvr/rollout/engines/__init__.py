"""Generation engines: what samples the model's tokens for the rollout sources.

protocols.py  GenerationEngine (single-turn) and MultiTurnEngine (episodes with tools), SamplingParams, Generation
sampling.py   top-k/top-p, the inverse-CDF sampler, each episode's seed
native_sampler.py/.c  the sampler's unfiltered draw over wide vocabularies as one C pass per row on the CPU
turns.py      what every engine's multi-turn decode shares: the TurnDriver, the Trace, how a turn ends
hf/           the hf engine: transformers models, the trainer's own module (see its __init__)
vllm.py       colocated vLLM
remote/       generation servers (`rollout.servers`): the client side, weight sync, failover (see its __init__)
__init__.py   ENGINES and make_engine: the engine `rollout.engine` names, imported only when chosen
"""

from __future__ import annotations

from rlvr.rollout.engines.protocols import GenerationEngine


ENGINES = ("hf", "torch", "vllm")  # `torch` is an alias of `hf`


def make_engine(name: str, model, tokenizer, cfg=None, save_adapter=None) -> GenerationEngine:
    """The engine `rollout.engine` names; `cfg` (rlvr.config.Config) configures vllm, and with
    LoRA `save_adapter(path)` writes the adapter it loads."""
    if name in ("hf", "torch"):
        from rlvr.rollout.engines.hf import HFEngine

        return HFEngine(
            model,
            tokenizer,
            merge_lora=cfg is None or cfg.model.lora.merge_for_generation,
            compile_decode=cfg is not None and cfg.rollout.compile == "on",
        )
    if name == "vllm":
        from rlvr.models.loading import resolve_existing
        from rlvr.rollout.engines.vllm import VLLMEngine

        if cfg is None:
            raise ValueError("make_engine('vllm', ...) needs the run's config")
        v = cfg.rollout.vllm
        return VLLMEngine(
            model,
            tokenizer,
            model_path=resolve_existing(cfg.model.path),
            dtype=cfg.model.dtype if v.dtype == "auto" else v.dtype,
            gpu_memory_utilization=v.gpu_memory_utilization,
            sleep=v.sleep,
            max_model_len=v.max_model_len,
            enforce_eager=v.enforce_eager,
            seed=cfg.seed,
            lora_rank=cfg.model.lora.r,
            save_adapter=save_adapter,
        )
    raise ValueError(f"rollout.engine: unknown engine {name!r}; choose one of: {', '.join(ENGINES)}")
