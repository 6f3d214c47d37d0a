"""Built-in rewards of the built-in tasks."""

from __future__ import annotations

import bisect
import re

from rlvr.data.arithmetic import is_correct
from rlvr.data.guess_number import MAX_GUESSES
from rlvr.rewards.text import completion_text  # noqa: F401  (re-exported: users import it from here)


def arithmetic_correct(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion is exactly the integer in the `answer` column, else 0.0.

    >>> arithmetic_correct(["12+30="], ["42"], answer=["42"])
    [1.0]
    """
    return [float(is_correct(completion_text(c), a)) for c, a in zip(completions, answer)]


# --- multi-turn tool-use tasks (tag protocol: `<calc>..</calc>` / `<guess>..</guess>` calls, `<result>..</result>` replies) ---

_RESULT_END = "</result>"


def final_answer_text(completion) -> str:
    """The model's final answer: the last assistant message's text after its last `</result>`
    (the whole of it when there is none), stripped. Plain text counts as one assistant message."""
    if isinstance(completion, (list, tuple)):
        assistant = [m for m in completion if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
        text = str(assistant[-1].get("content") or "") if assistant else ""
    else:
        text = completion_text(completion)
    return text.rsplit(_RESULT_END, 1)[-1].strip()


def final_answer(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the model's final answer is exactly the `answer` column, else 0.0.

    The final answer is the last assistant message of a multi-turn completion, or the text after
    the last `</result>` of a plain one; anything but the number there (a tool call left
    unanswered, words around the number) is wrong.

    >>> final_answer(["123*45="], ["<calc>123*45</calc><result>5535</result>5535"], answer=["5535"])
    [1.0]
    >>> final_answer(["123*45="], [[{"role": "assistant", "content": "<calc>123*45</calc>"},
    ...                            {"role": "tool", "name": "calculator", "content": "5535"}]], answer=["5535"])
    [0.0]
    """
    return [float(final_answer_text(c) == str(a).strip()) for c, a in zip(completions, answer)]


def _guesses_in_text(text: str) -> list[tuple[str, str | None]]:
    """[(guess, the `<result>` right after its `</guess>`, or None)], as the regex
    `<guess>(.*?)</guess>\\s*(?:<result>(.*?)</result>)?` would find them, but in one linear pass
    (that regex takes minutes on 50 KB of unclosed `<guess>` tags)."""
    closes = {tag: [m.start() for m in re.finditer(re.escape(tag), text)] for tag in ("</guess>", _RESULT_END)}
    out, pos = [], 0
    for m in re.finditer("<guess>", text):
        if m.start() < pos:
            continue
        k = bisect.bisect_left(closes["</guess>"], m.end())
        if k == len(closes["</guess>"]):
            break
        end = closes["</guess>"][k]
        guess, pos, reply = text[m.end():end], end + len("</guess>"), None
        after = re.compile(r"\s*").match(text, pos).end()
        if text.startswith("<result>", after):
            r = bisect.bisect_left(closes[_RESULT_END], after + len("<result>"))
            if r < len(closes[_RESULT_END]):
                reply, pos = text[after + len("<result>"): closes[_RESULT_END][r]], closes[_RESULT_END][r] + len(_RESULT_END)
        out.append((guess.strip(), None if reply is None else reply.strip()))
    return out


def _guess_rounds(completion) -> list[tuple[str, str | None]]:
    """[(guess, reply or None)] in order. In a multi-turn completion the replies are the tool
    messages that follow a guess (text the model wrote itself never counts as a reply); in plain
    text, the `<result>` right after `</guess>`."""
    if not isinstance(completion, (list, tuple)):
        return _guesses_in_text(completion_text(completion))
    rounds: list[list] = []
    for m in completion:
        if not isinstance(m, dict):
            continue
        role, text = m.get("role", "assistant"), str(m.get("content") or "")
        if role == "assistant":
            rounds += [[guess, None] for guess, _ in _guesses_in_text(text)]
        elif role == "tool" and rounds and rounds[-1][1] is None:
            reply = text.strip()
            if reply.startswith("<result>") and reply.endswith(_RESULT_END):
                reply = reply[len("<result>"):-len(_RESULT_END)].strip()
            rounds[-1][1] = reply
    return [(g, r) for g, r in rounds]


def _same_number(guess: str, target) -> bool:
    try:
        return int(guess) == int(target)
    except (TypeError, ValueError):
        return False


def guessed(prompts, completions, target=None, max_guesses=None, **kwargs) -> list[float]:
    """1.0 when, within the first `max_guesses` guesses (column; 5 without it), a guess was answered
    `correct`, and, when the `target` column is given, that guess was the target; else 0.0.

    >>> guessed(["Guess my number from 1 to 30."],
    ...         ["<guess>15</guess><result>higher</result><guess>17</guess><result>correct</result>"], target=[17])
    [1.0]
    """
    n = len(completions)
    targets = target if target is not None else [None] * n
    limits = max_guesses if max_guesses is not None else [MAX_GUESSES] * n
    out = []
    for c, t, k in zip(completions, targets, limits):
        k = MAX_GUESSES if k is None else int(k)
        won = any(reply == "correct" and (t is None or _same_number(guess, t))
                  for guess, reply in _guess_rounds(c)[:k])
        out.append(float(won))
    return out
