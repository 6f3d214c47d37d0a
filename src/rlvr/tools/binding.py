"""Binding a call's arguments to a tool's parameters, converting values to the annotated types.

A dict binds by name. A raw string (the tag protocol's text between the tags) binds to the
tool's single parameter; a tool with several parameters takes a JSON object instead (with one
required parameter, text that is not a JSON object binds to that one). Values are converted
to the annotated type only when nothing is lost ("12" -> 12 for an int, 3.0 -> 3; "3.5" is not
an int); anything else is a `BindError`, which the runner reports as bad_arguments.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from rlvr.tools.registry import Tool

_BOOLS = {"true": True, "false": False, "1": True, "0": False}
_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list", dict: "an object"}


class BindError(ValueError):
    """The arguments do not fit the tool; the message says how (it reaches the model)."""


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool)) or value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _to_int(value: Any):
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        s = value.strip()
        try:
            return int(s)
        except ValueError:
            pass
        try:
            f = float(s)
        except ValueError:
            return None
        return int(f) if f.is_integer() else None
    return None


def _to_float(value: Any):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _to_bool(value: Any):
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return _BOOLS.get(value.strip().lower())
    return None


def _to_str(value: Any):
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


_SCALARS = {int: _to_int, float: _to_float, bool: _to_bool, str: _to_str}


def convert(value: Any, annotation: Any, name: str) -> Any:
    """`value` as `annotation` (int, float, bool, str, list, dict, Optional of those; others
    pass through unchanged)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None and len(members) < len(typing.get_args(annotation)):
            return None
        if len(members) != 1:
            return value  # a real union: nothing says which conversion is meant
        annotation = members[0]
    origin = typing.get_origin(annotation) or annotation
    if origin in _SCALARS:
        out = _SCALARS[origin](value)
        if out is None:
            raise BindError(f"argument {name!r} must be {_NAMES[origin]}, got {_show(value)}")
        return out
    if origin in (list, tuple, dict):
        want = dict if origin is dict else list
        if isinstance(value, str):  # a JSON list/object written as text
            try:
                value = json.loads(value)
            except ValueError:
                pass
        if isinstance(value, (list, tuple) if want is list else dict):
            return tuple(value) if origin is tuple else value
        raise BindError(f"argument {name!r} must be {_NAMES[want]}, got {_show(value)}")
    return value


def _expected(tool: Tool) -> str:
    return f"a JSON object with {', '.join(tool.params)}" if tool.params else "no arguments"


def _json_object(text: str) -> dict | None:
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def bind(arguments: dict | str, tool: Tool) -> dict:
    """Keyword arguments for `tool.fn`, or BindError."""
    if isinstance(arguments, str):
        if len(tool.params) == 1:
            arguments = {tool.params[0]: arguments}
        elif not tool.params:
            if arguments.strip() and _json_object(arguments) != {}:
                raise BindError(f"{tool.name} takes no arguments")
            arguments = {}
        else:
            parsed = _json_object(arguments)
            if parsed is None and len(tool.required) == 1:
                parsed = {tool.required[0]: arguments}
            if parsed is None:
                raise BindError(f"expected {_expected(tool)}")
            arguments = parsed
    if not isinstance(arguments, dict):
        raise BindError(f"expected {_expected(tool)}, got {type(arguments).__name__}")
    unknown = [k for k in arguments if k not in tool.params]
    if unknown and not tool.var_keyword:
        raise BindError(f"unexpected argument {unknown[0]!r}; expected {', '.join(tool.params) or 'none'}")
    missing = [p for p in tool.required if p not in arguments]
    if missing:
        raise BindError(f"missing argument {missing[0]!r}")
    return {k: convert(v, tool.types.get(k, Any), k) for k, v in arguments.items()}
