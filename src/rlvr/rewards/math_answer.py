"""Math answer correctness: 1.0 when the completion's final answer equals the ground truth, else 0.0.

    >>> grade = math()
    >>> grade(None, ["so x = \\\\boxed{\\\\frac{1}{2}}", "#### 3", "The answer is 0.5.", "#### 42 or #### 43"],
    ...       answer=["0.5", "4", "1/2", "42"])
    [1.0, 0.0, 1.0, 0.0]

1. The final answer is what the completion marks as one (`rlvr.rewards.math_extract`): a box,
   an `<answer>` tag, `#### x`, or an answer phrase ("the answer is x"). Without a marker it
   earns 0; `math(fallback="last_number")` then takes the number of the last sentence that has
   numbers, when it has exactly one.
2. Every marked answer must be right: two different answers (several boxes, "42 or 43", a list,
   an equation `41 = 42`) earn 0, whatever their order.
3. Values are read as people write them (`rlvr.rewards.math_values`) and numbers compared
   exactly; anything else (`(x+1)^2` against `x^2+2x+1`, `\\sqrt{8}` against `2\\sqrt{2}`) through
   math-verify when installed (`pip install 'rlvr[math]'`), else by exact text.
4. Every symbolic comparison runs in a worker process and is stopped at `timeout_s` seconds
   (`rlvr.rewards.symbolic`): `\\boxed{9^{9^{9}}}` earns 0 in that time, from any thread.

Config: `fn: math`, `fn: "math(column='solution', fallback='last_number', timeout_s=5)"`.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache

from rlvr.rewards import symbolic
from rlvr.rewards.factory import named, reward_factory
from rlvr.rewards.math_extract import TOO_LONG, final_answers
from rlvr.rewards.math_values import Expression, Value, asks_for_percent, normalize, read_answer, same_exactly
from rlvr.rewards.text import completion_text, prompt_text

log = logging.getLogger("rlvr.rewards")
FALLBACKS = (None, "last_number")


@lru_cache(maxsize=4096)
def gold_value(gold: str) -> Value:
    """The ground truth's value: its marked final answer when it has one (a GSM8K solution ends in
    `#### 72`), else the whole text."""
    marked = final_answers(gold) if re.search(r"####|\\boxed|\\fbox|<answer>", gold) else []
    text = marked[-1] if marked and marked[-1] != TOO_LONG else gold
    values = read_answer(text)
    return values[-1] if values else Expression(normalize(text), re.sub(r"\s+", "", normalize(text)))


def answer_values(text: str, prompt: str, fallback: str | None) -> list[Value] | None:
    """Every value the completion states as its final answer; None when it states none, hedges, or
    states something unreadable."""
    answers = final_answers(text, prompt, fallback)
    if not answers or TOO_LONG in answers:
        return None
    values = []
    for a in answers:
        read = read_answer(a)
        if read is None:
            return None
        values += read
    return values


def grade(
    prompts, completions, golds, *, fallback: str | None = None, timeout_s: float = symbolic.DEFAULT_TIMEOUT_S, use_math_verify: bool = True
) -> list[float | None]:
    """1.0 / 0.0 per completion (None where the gold is None); see the module docstring."""
    prompts = prompts if prompts is not None else [None] * len(completions)
    use_math_verify = use_math_verify and symbolic.AVAILABLE
    out: list[float | None] = []
    symbolic_needs: dict[int, list[tuple[str, str]]] = {}
    for i, (p, c, g) in enumerate(zip(prompts, completions, golds)):
        if g is None:
            out.append(None)
            continue
        ptext = prompt_text(p)
        gold = gold_value(str(g))
        values = answer_values(completion_text(c), ptext, fallback)
        if values is None:
            out.append(0.0)
            continue
        percent_question = asks_for_percent(ptext)
        verdicts = [same_exactly(gold, v, percent_question) for v in values]
        if False in verdicts or (None in verdicts and not use_math_verify):
            out.append(0.0)
            continue
        out.append(1.0)
        pending = [(gold.text, v.text) for v, ok in zip(values, verdicts) if ok is None]
        if pending:
            symbolic_needs[i] = pending
    if symbolic_needs:
        pairs = sorted({pair for needs in symbolic_needs.values() for pair in needs})
        equal = dict(zip(pairs, symbolic.POOL.equal_many(pairs, timeout_s)))
        for i, needs in symbolic_needs.items():
            out[i] = float(all(equal[pair] for pair in needs))
    return out


@reward_factory
def math(
    column: str = "answer", fallback: str | None = None, timeout_s: float = symbolic.DEFAULT_TIMEOUT_S, require_math_verify: bool = False
):
    """Build a math grader reading the ground truth from `column`."""
    if fallback not in FALLBACKS:
        raise ValueError(f"math: fallback must be one of {FALLBACKS}, got {fallback!r} (e.g. fallback='last_number')")
    if not timeout_s > 0:
        raise ValueError(f"math: timeout_s must be > 0 seconds, got {timeout_s} (e.g. timeout_s=3)")
    if require_math_verify and not symbolic.AVAILABLE:
        raise ImportError("math(require_math_verify=True) needs math-verify: pip install 'rlvr[math]'")
    if not symbolic.AVAILABLE:
        log.info("math grader: math-verify not installed, comparing numbers and exact text only")

    def reward(prompts, completions, **columns):
        if column not in columns:
            raise KeyError(f"math grader: the dataset has no {column!r} column (have: {sorted(columns)})")
        return grade(prompts, completions, columns[column], fallback=fallback, timeout_s=timeout_s)

    return named(reward, "math")
