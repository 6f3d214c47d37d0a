"""Reward functions: TRL's signature, loaded by name, run together with weights.

A reward function is `fn(prompts, completions, **columns) -> list[float | None]`: dataset
columns arrive as keyword arguments (plus `completion_ids`), and None means "not applicable
to this sample". Functions are named in config as a built-in name, `module:function`, or
`path/to/file.py:function`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

BUILTIN = {
    "arithmetic": "rlvr.rewards.builtin:arithmetic_correct",
}


class RewardError(ValueError):
    """A reward function is missing, or returned something unusable; the message names it."""


def load_reward_fn(spec: str) -> Callable:
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise RewardError(f"reward {spec!r}: use a built-in name ({', '.join(sorted(BUILTIN))}), module:function or file.py:function")
    where, name = target.rsplit(":", 1)
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise RewardError(f"reward {spec!r}: file not found: {path}")
        mod_name = f"rlvr_user_rewards_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise RewardError(f"reward {spec!r}: cannot import module {where!r}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RewardError(f"reward {spec!r}: {where} has no function {name!r}")
    return fn


def _accepts(fn: Callable) -> tuple[bool, set[str]]:
    params = inspect.signature(fn).parameters.values()
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    return var_kw, {p.name for p in params}


@dataclass
class RewardFn:
    name: str
    fn: Callable
    weight: float


class RewardRunner:
    """Calls every reward function on a batch and returns a [N, K] tensor (NaN where None)."""

    def __init__(self, fns: Sequence[RewardFn]):
        names = [f.name for f in fns]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise RewardError(f"two reward functions share the name {sorted(dupes)}: set `name` on one of them")
        self.fns = list(fns)

    @classmethod
    def from_config(cls, specs) -> "RewardRunner":
        fns = []
        for s in specs:
            fn = load_reward_fn(s.fn)
            fns.append(RewardFn(s.name or getattr(fn, "__name__", s.fn), fn, s.weight))
        return cls(fns)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fns]

    @property
    def weights(self) -> torch.Tensor:
        return torch.tensor([f.weight for f in self.fns], dtype=torch.float64)

    def __call__(self, prompts: list, completions: list[str], columns: dict[str, list], **extra) -> torch.Tensor:
        n = len(completions)
        out = torch.empty((n, len(self.fns)), dtype=torch.float64)
        for k, rf in enumerate(self.fns):
            var_kw, names = _accepts(rf.fn)
            kwargs = {**columns, **extra}
            if not var_kw:
                kwargs = {key: v for key, v in kwargs.items() if key in names}
            values = rf.fn(prompts=prompts, completions=completions, **kwargs)
            out[:, k] = torch.tensor(self._check(rf.name, values, n), dtype=torch.float64)
        return out

    @staticmethod
    def _check(name: str, values, n: int) -> list[float]:
        if not isinstance(values, (list, tuple)):
            raise RewardError(f"reward function {name!r} must return a list of {n} numbers, got {type(values).__name__}")
        if len(values) != n:
            raise RewardError(f"reward function {name!r} returned {len(values)} values for {n} completions")
        clean = []
        for i, v in enumerate(values):
            if v is None:
                clean.append(math.nan)
            elif isinstance(v, (int, float)) and not isinstance(v, bool) or isinstance(v, bool):
                v = float(v)
                if math.isnan(v) or math.isinf(v):
                    raise RewardError(f"reward function {name!r} returned {v} for completion {i}; return None for 'not applicable'")
                clean.append(v)
            elif hasattr(v, "item"):  # numpy / torch scalars
                clean.append(float(v.item()))
            else:
                raise RewardError(f"reward function {name!r} returned {v!r} ({type(v).__name__}) for completion {i}; expected a number or None")
        return clean
