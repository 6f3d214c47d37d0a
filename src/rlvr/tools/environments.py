"""Environments: TRL's `environment_factory` contract, one instance per episode.

An environment is a class with `reset(self, **kwargs) -> str | None` (called with the row's
columns at the start of an episode; text it returns is appended to the prompt), public methods
that are its tools (type hints and Google docstrings, as for any tool), and optionally
`get_reward(self) -> float` (sync or async) scoring the finished episode from its state.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from dataclasses import replace
from typing import Any, Callable

from rlvr.tasks import ENVIRONMENTS
from rlvr.specs import resolve
from rlvr.tools.registry import Tool, ToolError, environment_tools, is_async_callable


def load_environment(spec) -> type:
    """An environment class (or zero-argument factory) by built-in name, `file.py:Class` or `module:Class`."""
    if not isinstance(spec, str):
        obj = spec
    else:
        obj = resolve(
            ENVIRONMENTS.get(spec.strip(), spec.strip()),
            setting="environment",
            spec=spec,
            builtins=ENVIRONMENTS,
            what="function or class",
            error=ToolError,
        )
    if inspect.isclass(obj) and not callable(getattr(obj, "reset", None)):
        raise ToolError(f"environment {spec!r}: class {obj.__name__} has no reset(self, **kwargs) method")
    return obj


def call_sync(fn: Callable, *args, **kwargs):
    """Call a sync or async function from sync code (async ones on a private loop in a thread,
    since the caller may itself run inside an event loop)."""
    if not is_async_callable(fn):
        return fn(*args, **kwargs)
    box: list = []

    def run():
        try:
            box.append((asyncio.run(fn(*args, **kwargs)), None))
        except BaseException as e:
            box.append((None, e))

    t = threading.Thread(target=run, name="rlvr-env-async", daemon=True)
    t.start()
    t.join()
    value, error = box[0]
    if error is not None:
        raise error
    return value


class EnvironmentFactory:
    """One environment instance per episode, TRL's `environment_factory` contract.

    `reset(env, row)` passes the row's columns that `reset` accepts (all of them when it takes
    **kwargs) and returns its text or None; `get_reward(env)` returns its float. Both run in the
    caller's thread without a timeout: they are the environment's own code, not the model's."""

    def __init__(self, spec):
        self.spec = spec
        self.cls = load_environment(spec)
        self.name = getattr(self.cls, "__name__", str(spec))
        probe = self.new()
        if not callable(getattr(probe, "reset", None)):
            raise ToolError(f"environment {spec!r}: {self.name} instances have no reset(self, **kwargs) method")
        self._probe_tools, self._probe_type = environment_tools(probe), type(probe)
        self.schemas = [t.schema for t in self._probe_tools.values()]
        self.names = list(self._probe_tools)
        self.has_reward = callable(getattr(probe, "get_reward", None))

    def new(self) -> Any:
        try:
            return self.cls()
        except Exception as e:
            raise ToolError(f"environment {self.spec!r}: {self.name}() failed: {type(e).__name__}: {e}") from None

    def tools(self, env: Any) -> dict[str, Tool]:
        """env's tools: the first instance's, bound to env (the schemas come from the class's methods: built once, not
        per episode, where parsing the docstrings took 0.4 ms an episode), or built afresh for an instance of another
        class (a factory that returns instances of several)."""
        if type(env) is not self._probe_type:
            return environment_tools(env)
        return {name: replace(tool, fn=getattr(env, tool.fn.__name__)) for name, tool in self._probe_tools.items()}

    def reset(self, env: Any, row: dict) -> str | None:
        params = inspect.signature(env.reset).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            names = {p.name for p in params}
            row = {k: v for k, v in row.items() if k in names}
        text = call_sync(env.reset, **row)
        if text is not None and not isinstance(text, str):
            raise ToolError(f"environment {self.name}: reset() returned {type(text).__name__}; it must return a string or None")
        return text

    def get_reward(self, env: Any) -> float | None:
        """The episode's reward; None (not applicable) passes through, as for reward functions."""
        value = call_sync(env.get_reward)
        if value is None:
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ToolError(f"environment {self.name}: get_reward() returned {value!r}; it must return a float") from None
