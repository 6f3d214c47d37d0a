"""Functions and classes named by config strings: `module:name` or `path/to/file.py:name`, with
keyword-literal parameters after the name, `name(a=1, b='x')`.

Reward functions (`rewards`), tools and environments (`tools`) and a rollout function
(`rollout.function`) are named this way. One resolver loads them all, so their errors read
alike: each names the setting and the spec as written, says what was tried, and on a typo
suggests the nearest name (`did you mean 'math'?`). A caller passes its own exception class
(RewardError, ToolError) so that its users catch what they always caught.

Objects given to rlvr from Python (rlvr.GRPOTrainer's callables) are named `rlvr_live:NAME` (rlvr.live).

This module imports nothing else of rlvr but rlvr.live.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib
import importlib.util
import sys
import threading
import types
from pathlib import Path
from typing import Any, Iterable

from rlvr import live

FORMS = "module:name or path/to/file.py:name"


class SpecError(ValueError):
    """A config string names nothing that loads; the message names the setting, the spec and what to do."""


def split_params(spec: str, *, setting: str, error: type[Exception] = SpecError) -> tuple[str, dict]:
    """`name(a=1, b='x')` -> ("name", {"a": 1, "b": "x"}); literals only, nothing is evaluated."""
    spec = spec.strip()
    if not spec.endswith(")") or "(" not in spec:
        return spec, {}
    head = spec[: spec.index("(")]
    try:
        call = ast.parse("f" + spec[len(head) :], mode="eval").body
        if not isinstance(call, ast.Call) or call.args:
            raise ValueError("use keyword arguments")
        return head.strip(), {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError) as e:
        raise error(f"{setting} {spec!r}: parameters must be keyword=literal pairs ({e})") from None


def resolve(
    target: str,
    *,
    setting: str,
    spec: str | None = None,
    builtins: Iterable[str] = (),
    what: str = "function",
    error: type[Exception] = SpecError,
) -> Any:
    """The callable `target` (`module:name` or `file.py:name`) names.

    `setting` and `spec` (the string as the user wrote it; default `target`) start every error
    message; `builtins`: the bare names the setting also accepts (the caller maps them to targets),
    listed and matched against when `target` is a bare name; `what` the kind of object expected."""
    spec = target if spec is None else spec
    if ":" not in target:
        names = sorted(builtins)
        forms = f"a built-in name ({', '.join(names)}), {FORMS}" if names else FORMS
        raise error(f"{setting} {spec!r}: use {forms}{did_you_mean(target, names)}")
    where, name = target.rsplit(":", 1)
    if where == live.MODULE and not hasattr(sys.modules.get(where), name):
        raise error(f"{setting} {spec!r}: {live.missing(target)}")
    module = _load_file(where, setting, spec, error) if where.endswith(".py") else _import(where, setting, spec, error)
    obj = getattr(module, name, None)
    if obj is None or not callable(obj):
        public = [n for n, v in vars(module).items() if not n.startswith("_") and callable(v)]
        raise error(f"{setting} {spec!r}: {where} has no {what} {name!r}{did_you_mean(name, public)}")
    return obj


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest of `names`, or ""."""
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _import(where: str, setting: str, spec: str, error: type[Exception]) -> types.ModuleType:
    try:
        return importlib.import_module(where)
    except ImportError as e:
        raise error(f"{setting} {spec!r}: cannot import module {where!r}: {e}") from None


_file_modules: dict[tuple, types.ModuleType] = {}
_file_lock = threading.Lock()


def _load_file(where: str, setting: str, spec: str, error: type[Exception]) -> types.ModuleType:
    """The module of a .py file, run once per file version: specs naming one file share its globals
    (a tool's state, a reward's cache), and an edited file is run again."""
    path = Path(where)
    if not path.is_file():
        raise error(f"{setting} {spec!r}: file not found: {path} (relative to {Path.cwd()})")
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    with _file_lock:
        module = _file_modules.get(key)
        if module is None:
            # the same name in every process that loads this file (ranks unpickle each other's objects by it): from
            # its path and contents, not hash(), which differs between processes
            digest = hashlib.sha1(str(path.resolve()).encode() + b"\0" + path.read_bytes()).hexdigest()[:16]
            mod_name = f"rlvr_user_{digest}"
            module_spec = importlib.util.spec_from_file_location(mod_name, path)
            assert module_spec is not None and module_spec.loader is not None, "a .py file always gets a source loader"
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[mod_name] = module  # dataclasses, pickling and typing look the module up by name
            try:
                module_spec.loader.exec_module(module)
            except Exception as e:
                del sys.modules[mod_name]
                raise error(f"{setting} {spec!r}: importing {path} failed: {type(e).__name__}: {e}") from None
            _file_modules[key] = module
    return module
