"""rlvr: GRPO fine-tuning for language models on tasks whose answers a program can check.

The Python API (rlvr.api), importable from here without loading torch until it is used:

    rlvr.train(config, *overrides) -> Run          the CLI's `rlvr train`
    rlvr.evaluate(model, ...)                       the CLI's `rlvr eval`
    rlvr.GRPOConfig, rlvr.GRPOTrainer               TRL 1.16's classes, same arguments and meanings
"""

__version__ = "0.1.0"

_API = ("train", "evaluate", "Run", "GRPOConfig", "GRPOTrainer")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        import rlvr.api

        return getattr(rlvr.api, name)
    raise AttributeError(f"module 'rlvr' has no attribute {name!r}")
