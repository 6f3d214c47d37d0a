"""Tools by name: TRL's contract, resolved from config strings.

A tool is a plain Python function (sync or async) with type hints and a Google-style docstring;
its JSON schema (what the chat template shows the model) comes from
`transformers.utils.get_json_schema`. Specs name a built-in (`calculator`, `python`),
`module:function` or `path/to/file.py:function`. A spec may name a class instead: it is then
stateful, one instance per episode, its public methods the tools (the built-in `python` is
one; constructor parameters go in the spec as literals, `python(timeout_s=5)`).

Environments (TRL's `environment_factory`) are such classes plus a lifecycle: environments.py.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from transformers.utils import get_json_schema

from rlvr.specs import resolve, split_params

BUILTIN = {
    "calculator": "rlvr.tools.builtin:calculator",
    "python": "rlvr.tools.builtin:PythonSession",
}
RESERVED = ("reset", "get_reward")  # environment lifecycle methods, never tools


class ToolError(ValueError):
    """A tool or environment cannot be loaded or used; the message names it and what to do."""


@dataclass
class Tool:
    """One callable tool: its schema (for the chat template) and each parameter's annotation."""

    name: str
    fn: Callable
    schema: dict
    params: list[str]
    types: dict[str, Any]
    required: list[str] = field(default_factory=list)
    is_async: bool = False
    var_keyword: bool = False  # accepts **kwargs: unknown argument names are passed through


def is_async_callable(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def make_tool(fn: Callable, spec: str | None = None) -> Tool:
    """Wrap a function (or bound method) as a Tool, with its schema from hints and docstring."""
    label = getattr(fn, "__qualname__", None) or repr(fn)
    where = f"tool {spec!r} ({label})" if spec and spec != label else f"tool {label}"
    try:
        schema = get_json_schema(fn)
    except Exception as e:  # transformers' TypeHintParsingException / DocstringParsingException
        raise ToolError(
            f"{where}: cannot build its schema: {e}. A tool needs a type hint on every "
            "argument and a Google-style docstring with an Args: line per argument"
        ) from None
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # unresolvable forward references
        raise ToolError(f"{where}: cannot read its type hints: {e}") from None
    sig = inspect.signature(fn)
    plain = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values()):
        raise ToolError(f"{where}: *args cannot be called by name; give each argument a name")
    return Tool(
        name=schema["function"]["name"],
        fn=fn,
        schema=schema,
        params=[p.name for p in plain],
        types={p.name: hints.get(p.name, Any) for p in plain},
        required=[p.name for p in plain if p.default is p.empty],
        is_async=is_async_callable(fn),
        var_keyword=any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()),
    )


def _target(spec) -> tuple[str, Any, dict]:
    """(label, function or class, constructor params) for a spec string or a Python object."""
    if not isinstance(spec, str):
        return getattr(spec, "__name__", repr(spec)), spec, {}
    name, params = split_params(spec, setting="tool", error=ToolError)
    obj = resolve(BUILTIN.get(name, name), setting="tool", spec=spec, builtins=BUILTIN, what="function or class", error=ToolError)
    if params and not inspect.isclass(obj):
        raise ToolError(f"tool {spec!r}: {name} is a function and takes no parameters in its spec")
    return spec, obj, params


def environment_tools(env: Any) -> dict[str, Tool]:
    """An instance's tools: its public methods except `reset` and `get_reward`, bound to it.

    Methods are listed on the class, as TRL does, so properties are not evaluated."""
    out = {}
    for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction):
        if not name.startswith("_") and name not in RESERVED:
            tool = make_tool(getattr(env, name), spec=f"{type(env).__name__}.{name}")
            out[tool.name] = tool
    return out


def load_tool(spec) -> Tool:
    """A tool by spec. A class spec must have exactly one public method (a fresh instance's)."""
    label, obj, params = _target(spec)
    if not inspect.isclass(obj):
        return make_tool(obj, spec=label)
    tools = environment_tools(_construct(label, obj, params))
    if len(tools) != 1:
        raise ToolError(
            f"tool {label!r}: class {obj.__name__} has {len(tools)} public methods "
            f"({', '.join(tools) or 'none'}); use ToolSet or an environment for several"
        )
    return next(iter(tools.values()))


def _construct(label: str, cls: type, params: dict) -> Any:
    try:
        return cls(**params)
    except Exception as e:
        args = ", ".join(f"{k}={v!r}" for k, v in params.items())
        raise ToolError(f"tool {label!r}: {cls.__name__}({args}) failed: {type(e).__name__}: {e}") from None


class ToolSet:
    """The tools of a run. Functions are shared by all episodes; classes (stateful, like the
    built-in `python`) get a fresh instance per episode from `for_episode()`."""

    def __init__(self, specs: Sequence):
        self._shared: dict[str, Tool] = {}
        self._stateful: list[tuple[str, type, dict]] = []
        self.schemas: list[dict] = []
        self.names: list[str] = []
        for spec in specs:
            label, obj, params = _target(spec)
            if inspect.isclass(obj):
                tools = environment_tools(_construct(label, obj, params))  # a probe, for the schemas
                self._stateful.append((label, obj, params))
            else:
                tool = make_tool(obj, spec=label)
                tools = {tool.name: tool}
                self._shared[tool.name] = tool
            for name, tool in tools.items():
                if name in self.names:
                    raise ToolError(f"tool {label!r}: a tool named {name!r} is already defined; names must be unique")
                self.names.append(name)
                self.schemas.append(tool.schema)

    def for_episode(self) -> dict[str, Tool]:
        tools = dict(self._shared)
        for label, cls, params in self._stateful:
            tools.update(environment_tools(_construct(label, cls, params)))
        return {name: tools[name] for name in self.names}
