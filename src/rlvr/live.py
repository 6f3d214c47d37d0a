"""Python objects that a config names: what `rlvr.GRPOTrainer` was given (reward callables, tools, an environment
class, a rollout function, datasets, a loaded model and tokenizer), registered under `rlvr_live:NAME`.

A config holds strings (it is written to config.yaml and read back on resume), so an object that
no `module:name` spec reaches (a function defined in a script or a notebook) is registered here and
the config names it as `rlvr_live:NAME`. `rlvr_live` is a module in sys.modules, so the spec
resolver (rlvr.specs) imports these names like any other; datasets, models and tokenizers are
looked up with `get`. The names live as long as the process: a run started this way resumes from
the same script (`trainer.train(resume_from_checkpoint=True)`), not from the CLI.

This module imports nothing else of rlvr.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from typing import Any

MODULE = "rlvr_live"
PREFIX = MODULE + ":"


def _module() -> types.ModuleType:
    module = sys.modules.get(MODULE)
    if module is None:
        module = types.ModuleType(MODULE, "Python objects given to rlvr in this process (rlvr.live)")
        sys.modules[MODULE] = module
    return module


def importable_spec(obj: Any) -> str | None:
    """`module:name` when importing that module gives back this very object (a function of an installed
    module or a file on sys.path, not one defined in __main__ or a notebook); else None."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not name or module == "__main__" or "." in name or "<" in name:
        return None
    try:
        return f"{module}:{name}" if getattr(importlib.import_module(module), name, None) is obj else None
    except ImportError:
        return None


def register(obj: Any, name: str) -> str:
    """The spec `rlvr_live:NAME` for `obj` (NAME: `name` made an identifier). A name keeps its meaning across runs
    of one script (the same role, e.g. the training dataset), so that a run resumed from it names the same
    objects in its config; registering another object under it replaces the old one."""
    base = re.sub(r"\W", "_", name) or "obj"
    base = "_" + base if base[0].isdigit() else base
    setattr(_module(), base, obj)
    return PREFIX + base


def is_live(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def get(spec: str, what: str) -> Any:
    """The object registered as `spec`; a LookupError naming `what` (the setting) when this process has none."""
    obj = getattr(sys.modules.get(MODULE), spec[len(PREFIX) :], None) if is_live(spec) else None
    if obj is None:
        raise LookupError(f"{what}={spec!r}: {missing(spec)}")
    return obj


def missing(spec: str) -> str:
    """Why a `rlvr_live:` name is not found, and what to do."""
    return (
        f"{spec} names a Python object given to rlvr.GRPOTrainer in the process that started the run; this process "
        "has none by that name: resume such a run from the same script (trainer.train(resume_from_checkpoint=True))"
    )
