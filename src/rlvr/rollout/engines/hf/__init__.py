"""The hf engine: generation with any transformers causal LM, sharing the trainer's model."""

from rlvr.rollout.engines.hf.engine import HFEngine

__all__ = ["HFEngine"]
