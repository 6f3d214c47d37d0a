"""What a completion gives as its final answer: every marked answer, so that hedging shows.

    >>> final_answers("so \\\\boxed{\\\\frac{1}{2}}")
    ['\\\\frac{1}{2}']
    >>> final_answers("#### 42 ... or rather #### 43")
    ['42', '43']
    >>> final_answers("The answer is 41 apples. (Check: 41 + 1 = 42)")
    ['41 apples']
    >>> final_answers("Adding up: 3 + 4 = 7")  # no marker: no answer (unless fallback="last_number")
    []

A final answer is marked by `\\boxed{}` (or `\\fbox{}`), `<answer>...</answer>`, `#### x` (to the end
of its line), or an answer phrase ("the answer is x", "final answer: x", "Answer: x", up to the end
of its sentence). All of them are returned, in order, and the grader pays only when every one is
right. A marker whose text holds another marker (`<answer>\\boxed{4}</answer>`) defers to it; a
marker in two lines copied from the prompt (an echoed worked example) does not count. Every pass is
linear in the text, so 50 KB of digits or thousands of nested boxes cost milliseconds.
"""

from __future__ import annotations

import bisect
import re

from rlvr.rewards.math_values import MAX_ANSWER_CHARS, numbers_in_prose

TOO_LONG = "\x00too long"  # stands for a marked answer longer than any real one (never equal to anything)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_OPEN, _ANSWER_CLOSE = re.compile(r"<answer>", re.IGNORECASE), re.compile(r"</answer>", re.IGNORECASE)
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_PHRASE = re.compile(
    r"(?:\bfinal answer|\bthe answer|^[ \t*#]*answer|\*\*answer)\s*(?:\*\*)?\s*(?:is|:|=|\*\*:)\s*(?:\*\*)?[ \t]*",
    re.IGNORECASE | re.MULTILINE,
)
_PHRASE_END = re.compile(r"[.!?](?=\s|$)|\n|;|\s\(|,?\s+(?:because|since|as|which|so|but|for|when|where|given)\b", re.IGNORECASE)
_FILLER = re.compile(r"^(?:(?:therefore|thus|so|then|just|simply|clearly|exactly|indeed|equal to|equals|given by|[=:])\s*)+", re.IGNORECASE)
_MARKED = re.compile(r"\\(?:boxed|fbox)\s*\{|<answer>|####", re.IGNORECASE)


def _brace_ends(text: str) -> dict[int, int]:
    """{index of "{": index of its "}"} for every balanced pair, in one pass."""
    ends, stack = {}, []
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            ends[stack.pop()] = m.start()
    return ends


def _boxes(text: str) -> list[tuple[int, str]]:
    found = [m for m in _BOX.finditer(text)]
    if not found:
        return []
    ends = _brace_ends(text)
    out = []
    for m in found:
        open_at = m.end() - 1
        if open_at in ends:  # an unclosed box (a truncated completion) states nothing
            out.append((m.start(), _clip(text, open_at + 1, ends[open_at])))
    return out


def _answer_tags(text: str) -> list[tuple[int, str]]:
    closes = [m.start() for m in _ANSWER_CLOSE.finditer(text)]
    out = []
    for m in _ANSWER_OPEN.finditer(text):
        k = bisect.bisect_left(closes, m.end())
        if k < len(closes):
            out.append((m.start(), _clip(text, m.end(), closes[k])))
    return out


def _phrases(text: str) -> list[tuple[int, str]]:
    out = []
    for m in _PHRASE.finditer(text):
        rest = text[m.end() : m.end() + MAX_ANSWER_CHARS]
        end = _PHRASE_END.search(rest)
        said = _FILLER.sub("", rest[: end.start() if end else len(rest)]).strip().strip("*").strip()
        # "the answer is the number of apples ..." names no answer; "the answer is 42", "$x=3$", "(B)" do
        if re.match(r"[-+\u2212$\\(\[{\d.]|[A-Za-z]\W*$|[A-Za-z]\w*\s*=", said):
            out.append((m.start(), said))
    return out


def _clip(text: str, start: int, end: int) -> str:
    return text[start:end].strip() if end - start <= MAX_ANSWER_CHARS else TOO_LONG


def _copied(text: str, at: int, prompt_text: str) -> bool:
    """The line holding position `at` and the line before it both appear in the prompt: a worked
    example copied from it. (One line alone may well be the model's own "The answer is 7.")"""
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    line = text[start : end if end >= 0 else len(text)].strip()
    before = text[text.rfind("\n", 0, max(0, start - 1)) + 1 : max(0, start - 1)].strip()
    return len(line) >= 8 and len(before) >= 8 and line in prompt_text and before in prompt_text


def final_answers(text: str, prompt_text: str = "", fallback: str | None = None) -> list[str]:
    """Every final answer the text marks, in order (see the module docstring); with
    fallback="last_number" and no marker, the number of the last sentence holding numbers, when it holds just one."""
    marked = _boxes(text) + _answer_tags(text) + [(m.start(), m.group(1).strip()) for m in _HASHES.finditer(text)]
    marked += _phrases(text)
    out = []
    for at, said in sorted(marked, key=lambda x: x[0]):
        if said != TOO_LONG and _MARKED.search(said):
            continue  # the marker inside counts instead
        if prompt_text and _copied(text, at, prompt_text):
            continue  # an example's answer copied from the prompt, not the model's own
        out.append(said)
    if not out and not marked and fallback == "last_number":
        out = _last_number(text)
    return out


def _last_number(text: str) -> list[str]:
    for sentence in reversed(re.split(r"(?<=[.!?])\s+|\n", text[-4 * MAX_ANSWER_CHARS :])):
        numbers = numbers_in_prose(sentence)
        if numbers:
            return [numbers[-1].text] if len({n.value for n in numbers}) == 1 else []
    return []
