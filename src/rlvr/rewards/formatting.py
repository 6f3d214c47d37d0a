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

Tags are found in one linear pass (50 KB completions cost microseconds, never a regex's
backtracking), and text inside ``` code fences is code, not tags: a think block may quote
`<answer>` in code, and a format written inside a code block is not the format.

Known hacks guarded: empty blocks (`<think></think>`) earn nothing from strict/lenient; tag
spam or nesting (`<think><think>..`) fails strict/lenient and earns no partial credit for that
tag; tags out of order earn no partial credit at all; text after `</answer>` fails strict and
lenient; the whole format inside a code block earns nothing.
"""

from __future__ import annotations

import re

from rlvr.rewards.text import completion_text

TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_TAG = re.compile(r"</?(?:think|answer)>")
_FENCE = re.compile(r"```")


def tags(text: str) -> list[re.Match]:
    """The think/answer tags of a text, in order, leaving out those inside ``` code fences."""
    fences = [m.start() for m in _FENCE.finditer(text)]
    spans = list(zip(fences[::2], fences[1::2] + [len(text)] * (len(fences) % 2)))
    out, k = [], 0
    for m in _TAG.finditer(text):
        while k < len(spans) and spans[k][1] < m.start():
            k += 1
        if not (k < len(spans) and spans[k][0] <= m.start() < spans[k][1]):
            out.append(m)
    return out


def _blocks(text: str) -> list[re.Match] | None:
    """The four tags when the text has exactly think, /think, answer, /answer, in that order, with
    visible text in both blocks; else None."""
    found = tags(text)
    if [m.group() for m in found] != list(TAGS):
        return None
    think, end_think, answer, end_answer = found
    if not text[think.end() : end_think.start()].strip() or not text[answer.end() : end_answer.start()].strip():
        return None
    return found


def _is_strict(text: str) -> bool:
    found = _blocks(text)
    if found is None:
        return False
    think, end_think, answer, end_answer = found
    return (
        think.start() == 0
        and text[think.end()] == "\n"
        and text[end_think.start() - 1] == "\n"
        and text[end_think.end() : answer.start()] == "\n"
        and text[answer.end()] == "\n"
        and text[end_answer.start() - 1] == "\n"
        and not text[end_answer.end() :].strip()
    )


def _is_lenient(text: str) -> bool:
    found = _blocks(text)
    if found is None:
        return False
    think, end_think, answer, end_answer = found
    return not text[: think.start()].strip() and not text[end_think.end() : answer.start()].strip() and not text[end_answer.end() :].strip()


def _partial(text: str) -> float:
    found = [m.group() for m in tags(text)]
    once = [t for t in TAGS if found.count(t) == 1]
    in_order = [t for t in found if t in once] == once  # the single ones appear in the format's order
    return 0.25 * len(once) if in_order else 0.0


def format_strict(prompts, completions, **kwargs) -> list[float]:
    return [float(_is_strict(completion_text(c))) for c in completions]


def format_lenient(prompts, completions, **kwargs) -> list[float]:
    return [float(_is_lenient(completion_text(c))) for c in completions]


def format_partial(prompts, completions, **kwargs) -> list[float]:
    return [_partial(completion_text(c)) for c in completions]
