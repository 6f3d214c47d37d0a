"""Built-in rewards of the built-in tasks."""

from __future__ import annotations

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


_GUESS_AND_RESULT = re.compile(r"<guess>(.*?)</guess>\s*(?:<result>(.*?)</result>)?", re.DOTALL)


def _guess_rounds(completion) -> list[tuple[str, str | None]]:
    """[(guess, reply or None)] in order. In a multi-turn completion the replies are the tool
    messages that follow a guess (text the model wrote itself never counts as a reply); in plain
    text, the `<result>` right after `</guess>`."""
    if not isinstance(completion, (list, tuple)):
        return [(m.group(1).strip(), None if m.group(2) is None else m.group(2).strip())
                for m in _GUESS_AND_RESULT.finditer(completion_text(completion))]
    rounds: list[list] = []
    for m in completion:
        if not isinstance(m, dict):
            continue
        role, text = m.get("role", "assistant"), str(m.get("content") or "")
        if role == "assistant":
            rounds += [[g.group(1).strip(), None] for g in _GUESS_AND_RESULT.finditer(text)]
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
