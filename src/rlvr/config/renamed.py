"""Config keys that have moved: a config.yaml or a `key=value` override written with an old key still loads,
as the key's new place, so every run folder written before the move still resumes and evaluates. New runs
write the new names; `rlvr train --help-config` lists the old ones.

This module imports nothing else of rlvr but the schema's ConfigError.
"""

from __future__ import annotations

import copy
from typing import Any

from rlvr.config.schema import ConfigError

# old top-level key -> its place now (written by runs before the top level was grouped into eval, checkpoint, logging)
RENAMED = {
    "eval_before_after": "eval.before_after",
    "eval_every": "eval.every",
    "save_every": "checkpoint.every",
    "keep_checkpoints": "checkpoint.keep",
    "log_completions_every": "logging.completions_every",
    "num_completions_logged": "logging.num_completions",
    "report_to": "logging.report_to",
    "doctor_every": "logging.doctor_every",
}


def current_key(key: str) -> str:
    """The dotted key's current name: `save_every` -> `checkpoint.every`, `report_to.0` -> `logging.report_to.0`."""
    head, _, rest = key.partition(".")
    return RENAMED[head] + (f".{rest}" if rest else "") if head in RENAMED else key


def upgrade(tree: dict[str, Any], where: str = "") -> dict[str, Any]:
    """A config mapping (config.yaml as read) with every old key moved to its place now; a copy, the input is left
    as it is. An old key and its new one both given with different values: ConfigError (`where` names the file)."""
    out = copy.deepcopy(tree)
    for old, new in RENAMED.items():
        if old not in out:
            continue
        value = out.pop(old)
        group, leaf = new.split(".")
        section = out.get(group)
        if section is None:
            section = out[group] = {}
        if not isinstance(section, dict):
            continue  # `eval: 3`: the group itself is wrong, and loading says so naming it
        if leaf in section and section[leaf] != value:
            raise ConfigError(
                f"`{old}` (the old name of `{new}`) and `{new}` are both set{where}, to {value!r} and {section[leaf]!r}: keep `{new}`"
            )
        section[leaf] = value
    return out
