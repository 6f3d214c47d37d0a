"""Format rewards for `<think>...</think><answer>...</answer>` completions.

    >>> good = "<think>\\n2 + 2 is 4\\n</think>\\n<answer>\\n4\\n</answer>"
    >>> format_strict(None, [good, "<think>x</think><answer>4</answer>", "4"])
    [1.0, 0.0, 0.0]
    >>> format_lenient(None, [good, "<think>x</think> <answer>4</answer>", "4"])
    [1.0, 1.0, 0.0]
    >>> format_partial(None, ["<think>x</think>", "<think>x</think><answer>4</answer>"])
    [0.5, 1.0]

strict: the whole completion is exactly one think block then one answer block, each tag on
its own line. lenient: one think block followed by one answer block, any whitespace, nothing
after the answer. partial: 0.25 for each of the four tags present exactly once, so a model
learning the format gets a gradient before it gets it all right.

Known hacks guarded: empty blocks (`<think></think>`) earn nothing from strict/lenient; tag
spam (many `<answer>` tags) fails strict/lenient and earns no partial credit for that tag;
text after `</answer>` fails strict and lenient.
"""

from __future__ import annotations

import re

from rlvr.rewards.text import completion_text

_FREE = r"(?:(?!</?think>|</?answer>).)*?"  # text holding no tag
_BODY = _FREE + r"\S" + _FREE  # ... and at least one visible character
_STRICT = re.compile(rf"^<think>\n{_BODY}\n</think>\n<answer>\n{_BODY}\n</answer>\s*$", re.DOTALL)
_LENIENT = re.compile(rf"^\s*<think>{_BODY}</think>\s*<answer>{_BODY}</answer>\s*$", re.DOTALL)
TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def format_strict(prompts, completions, **kwargs) -> list[float]:
    return [float(bool(_STRICT.match(completion_text(c)))) for c in completions]


def format_lenient(prompts, completions, **kwargs) -> list[float]:
    return [float(bool(_LENIENT.match(completion_text(c)))) for c in completions]


def format_partial(prompts, completions, **kwargs) -> list[float]:
    return [sum(0.25 for t in TAGS if completion_text(c).count(t) == 1) for c in completions]
