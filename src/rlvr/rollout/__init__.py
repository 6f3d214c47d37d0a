"""Rollouts: the episodes the trainer learns from, the sources that make them, and the
generation engines those sources run on.

    episodes.py   Episodes (the seam: all the trainer sees) and the RolloutSource Protocol
    sources/      RolloutSource.rollout(rows, seeds) -> Episodes: single-turn, multi-turn with tools or an
                  environment, a user's rollout function; make_source picks one from the config
    engines/      GenerationEngine.generate(prompts, params, seeds) and MultiTurnEngine.generate_episodes(...):
                  the hf engine (engines/hf/) and vLLM (engines/vllm.py); make_engine picks one
"""

from rlvr.rollout.engines import ENGINES, make_engine
from rlvr.rollout.engines.protocols import Generation, GenerationEngine, MultiTurnEngine, SamplingParams
from rlvr.rollout.episodes import Episodes, RolloutSource
from rlvr.rollout.sources.single_turn import SingleTurnSource, as_completions

__all__ = [
    "ENGINES",
    "Episodes",
    "Generation",
    "GenerationEngine",
    "MultiTurnEngine",
    "RolloutSource",
    "SamplingParams",
    "SingleTurnSource",
    "as_completions",
    "make_engine",
]
