"""Rollouts: the episodes the trainer learns from, the sources that make them, and the
generation engines those sources run on.

    RolloutSource.rollout(rows, seeds) -> Episodes      (rlvr.rollout.episodes: the seam)
      SingleTurnSource  one model turn per prompt       (rlvr.rollout.sources.single_turn)
    GenerationEngine.generate(prompts, params, seeds)   (rlvr.rollout.engines.protocols, rlvr.rollout.engines)
      hf    KV-cached decode loop for transformers models (hf.py, shared_prefix.py, kv_buffers.py, attention.py)
      vllm  colocated vLLM (vllm_engine.py)
"""

from rlvr.rollout.engines import ENGINES, make_engine
from rlvr.rollout.engines.protocols import Generation, GenerationEngine, SamplingParams
from rlvr.rollout.episodes import Episodes, RolloutSource
from rlvr.rollout.sources.single_turn import SingleTurnSource, as_completions

__all__ = ["ENGINES", "Episodes", "Generation", "GenerationEngine", "RolloutSource", "SamplingParams", "SingleTurnSource", "as_completions", "make_engine"]
