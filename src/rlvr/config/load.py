"""Building a Config from YAML files and dotted `key=value` overrides, with types checked, old key names
moved to their places (rlvr.config.renamed) and unknown keys named (closest valid key suggested); field
documentation for --help-config."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

import yaml

from rlvr.config.renamed import RENAMED, current_key, upgrade
from rlvr.config.schema import Config, ConfigError, RewardConfig
from rlvr.config.trl_names import trl_hint

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_D = TypeVar("_D", bound="DataclassInstance")


# ---------------------------------------------------------------------------------------------
# Field documentation, read from the attribute docstrings above.


def field_docs(cls: type) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    class_def = tree.body[0]
    assert isinstance(class_def, ast.ClassDef), "getsource of a class is its class statement"
    body = class_def.body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)  # a field; class bodies have no `a.b: T` / `a[i]: T` targets
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        ):
            docs[node.target.id] = str(nxt.value.value)
    return docs


def old_names() -> list[str]:
    """`old = new` for every key that has moved (still accepted on load), for --help-config."""
    return [f"{old} = {new}" for old, new in RENAMED.items()]


def describe(cls: type[DataclassInstance] = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, doc) for every leaf field, for --help-config."""
    rows = []
    docs = field_docs(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        value = getattr(defaults, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a default: an instance
            rows += describe(type(value), f"{prefix}{f.name}.")
        else:
            rows.append((prefix + f.name, repr(value), docs.get(f.name, "")))
    return rows


# ---------------------------------------------------------------------------------------------
# Building a Config from plain data (YAML) with types checked and unknown keys named.


def _is_dataclass_type(hint: object) -> TypeGuard[type[DataclassInstance]]:
    """dataclasses.is_dataclass for a type hint (a class, never an instance)."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _valid_keys(cls: type[DataclassInstance] = Config, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        keys.append(prefix + f.name)
        t = hints[f.name]
        if _is_dataclass_type(t):
            keys += _valid_keys(t, f"{prefix}{f.name}.")
        elif typing.get_origin(t) is list and _is_dataclass_type(inner := typing.get_args(t)[0]):
            keys += _valid_keys(inner, f"{prefix}{f.name}.N.")
    return keys


def _first_unknown(generic: str, valid: set[str]) -> str:
    """The first part of a dotted key (list indexes written N) that does not name a valid key."""
    parts = generic.split(".")
    for i, part in enumerate(parts):
        if ".".join(parts[: i + 1]) not in valid:
            return part
    return parts[-1]


def _unknown_key(key: str, where: str) -> ConfigError:
    """The error for a key no field has: TRL's name for a setting gets rlvr's (wherever it was written),
    a known field under the wrong section gets its place, anything else the closest valid key."""
    generic = re.sub(r"\.\d+(\.|$)", r".N\1", key)
    valid = _valid_keys()
    part = _first_unknown(generic, set(valid))
    if trl := trl_hint(part):
        return ConfigError(f"unknown config key `{key}`{where}: {trl}")
    same_name = [k for k in valid if k.rsplit(".", 1)[-1] == part]
    close = same_name if len(same_name) == 1 else difflib.get_close_matches(generic, valid, n=1, cutoff=0.6)
    hint = f"; did you mean `{close[0].replace('.N.', '.0.')}`?" if close else ""
    return ConfigError(f"unknown config key `{key}`{where}{hint}")


def _coerce(value: Any, t: Any, key: str) -> Any:
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(t)
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none") and type(None) in args):
            if type(None) in args:
                return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"`{key}`: bad value {value!r}")
    if origin is list:
        (inner,) = typing.get_args(t)
        if not isinstance(value, list):
            raise ConfigError(f"`{key}` must be a list, got {value!r}")
        return [_coerce(v, inner, f"{key}.{i}") for i, v in enumerate(value)]
    if _is_dataclass_type(t):
        if isinstance(value, str) and t is RewardConfig:
            value = {"fn": value}  # `rewards: [arithmetic, my.py:fn]` shorthand
        if not isinstance(value, dict):  # `model: Qwen/...`, `tools: [calculator]`: TRL's meaning of the name
            trl = trl_hint(key) if "." not in key else None
            raise ConfigError(f"`{key}` must be a mapping, got {value!r}" + (f": {trl}" if trl else ""))
        return _from_dict(t, value, key + ".")
    if t is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"`{key}` must be true or false, got {value!r}")
    if t in (int, float):
        what = "an integer" if t is int else "a number"
        if not isinstance(value, bool):
            if isinstance(value, (int, float)) and (t is float or float(value).is_integer()):
                return t(value)
            if isinstance(value, str):
                try:
                    return t(value)
                except ValueError:
                    pass
        raise ConfigError(f"`{key}` must be {what}, got {value!r}")
    if t is str:
        if isinstance(value, bool):  # YAML 1.1 reads on/off/yes/no unquoted as booleans: `optim.compile: on`
            return "on" if value else "off"
        if isinstance(value, (str, int, float)):
            return str(value)
        raise ConfigError(f"`{key}` must be a string, got {value!r}")
    return value


def _from_dict(cls: type[_D], data: dict[Any, Any], prefix: str = "") -> _D:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for k, v in data.items():
        if k not in names:
            raise _unknown_key(prefix + str(k), "")
        kwargs[k] = _coerce(v, hints[k], prefix + k)
    return cls(**kwargs)


def to_dict(cfg: DataclassInstance) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node: Any = tree
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(node, list):
            idx = int(part)
            while len(node) <= idx:
                node.append({})
            if isinstance(node[idx], str):  # `rewards: [math]` shorthand, then `rewards.0.weight=...`
                node[idx] = {"fn": node[idx]}
            node = node[idx]
            continue
        if part not in node or node[part] is None:
            node[part] = [] if nxt.isdigit() else {}
        node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        idx = int(last)
        while len(node) <= idx:
            node.append({})
        node[idx] = value
    else:
        node[last] = value


def load_config(path: str | Path | Mapping[str, Any] | None = None, overrides: Sequence[str] = ()) -> Config:
    """A Config from an optional YAML file (or a mapping, nested as the YAML would be) plus `dotted.key=value`
    overrides (values parsed as YAML)."""
    tree = to_dict(Config())
    if isinstance(path, Mapping):  # rlvr.train({...}): checked as a YAML file would be, errors saying where
        _merge(tree, upgrade(dict(path), " in the config dict"), "", "the config dict")
    elif path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of config keys")
        _merge(tree, upgrade(loaded, f" in {p}"), "", p)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override `{item}` must look like key=value (e.g. optim.lr=1e-5)")
        key, raw = item.split("=", 1)
        key = current_key(key.strip())  # an old name (save_every=5) sets the key's place now
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        _check_key(key)
        _set_dotted(tree, key, value)
    return _from_dict(Config, tree)


def _check_key(key: str) -> None:
    generic = re.sub(r"\.\d+(\.|$)", r".N\1", key)
    valid = set(_valid_keys())
    if generic not in valid and not (generic.endswith(".N") and generic[:-2] in valid):
        raise _unknown_key(key, " in the command line")


def _merge(tree: dict[str, Any], loaded: dict[Any, Any], prefix: str, source: str | Path) -> None:
    for k, v in loaded.items():
        key = prefix + str(k)
        if k not in tree:
            raise _unknown_key(key, f" in {source}")
        if isinstance(tree[k], dict) and isinstance(v, dict):
            _merge(tree[k], v, key + ".", source)
        else:
            tree[k] = v
