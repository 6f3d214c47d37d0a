"""The built-in `guess_number` task: find a secret number in a few guesses, told higher or lower. Its rows,
its environment (`GuessNumber`, the built-in `guess_number` environment) and its verifier (the built-in
`guessed` reward).

A row is `{"prompt": [{"role": "user", "content": "Guess my number from 1 to 30."}], "target": 17,
"low": 1, "high": 30, "max_guesses": 5}`; every column but the prompt reaches the environment's
`reset(**row)` and the reward functions. The `guessed` reward reads the conversation and pays 1.0
when a guess of the target was answered `correct` within `max_guesses` guesses (what evaluation
uses; during training the environment's `get_reward` says the same).

The model has `max_guesses` calls of `guess(number)` to find the secret integer in [low, high].
Replies, exactly:

| reply | when |
|---|---|
| `higher` | the secret number is higher than the guess |
| `lower` | the secret number is lower than the guess |
| `correct` | the guess is the number (the game is won and over) |
| `out of range` | an integer outside [low, high] (it uses up a guess) |
| `not a number` | the argument is not an integer (it uses up a guess) |
| `no guesses left` | any guess once the game is over: won, or `max_guesses` guesses made |

With the tag protocol an episode reads `<guess>15</guess><result>higher</result><guess>22</guess>
<result>lower</result><guess>17</guess><result>correct</result></s>`: the model writes the guesses
and the final `</s>`, the environment the results. Bisection always wins when
2**max_guesses > high - low + 1 (the defaults: 5 guesses for 1..30).

Training draws targets uniformly from the whole range, and evaluation plays every target of the
range once (greedy): success over the game, not over unseen secrets. A split by target does not
measure strategy: a policy can learn never to guess numbers that were never the answer
(bench/results/tools_demo.md measured it on the bundled tiny-tools model).
"""

from __future__ import annotations

import bisect
import random
import re

from rlvr.rewards.text import completion_text
from rlvr.tasks.task import RESULT_CLOSE, RESULT_OPEN, Task, TaskOptions

LOW, HIGH, MAX_GUESSES = 1, 30, 5  # the defaults of the rows and of the environment


# ---------------------------------------------------------------------------- the rows


def prompt_text(low: int = LOW, high: int = HIGH) -> str:
    return f"Guess my number from {low} to {high}."


def row(target: int, *, low: int = LOW, high: int = HIGH, max_guesses: int = MAX_GUESSES) -> dict:
    """A dataset row: the prompt as chat messages, the secret number and the game's knobs."""
    return {
        "prompt": [{"role": "user", "content": prompt_text(low, high)}],
        "target": int(target),
        "low": low,
        "high": high,
        "max_guesses": max_guesses,
    }


def _check(low: int, high: int, max_guesses: int) -> None:
    if high - low < 1:
        raise ValueError(f"guess_number: the range needs at least two numbers, got {low}..{high}")
    if max_guesses < 1:
        raise ValueError(f"guess_number: max_guesses must be at least 1, got {max_guesses}")


def target_at(index: int, *, seed: int, low: int = LOW, high: int = HIGH) -> int:
    """Training target number `index`: uniform over the range; random access, so a run resumes exactly."""
    return random.Random(f"guess_number:{seed}:{index}").randint(low, high)


def train_row(index: int, *, seed: int, low: int = LOW, high: int = HIGH, max_guesses: int = MAX_GUESSES) -> dict:
    _check(low, high, max_guesses)
    return row(target_at(index, seed=seed, low=low, high=high), low=low, high=high, max_guesses=max_guesses)


def eval_rows(n: int, *, low: int = LOW, high: int = HIGH, max_guesses: int = MAX_GUESSES) -> list[dict]:
    """The evaluation set: every target of the range once, or n of them evenly spread when n is smaller."""
    _check(low, high, max_guesses)
    targets = list(range(low, high + 1))
    if n < len(targets):
        targets = [targets[i * len(targets) // n] for i in range(n)]
    return [row(t, low=low, high=high, max_guesses=max_guesses) for t in targets]


# ---------------------------------------------------------------------------- the environment


class GuessNumber:
    """One game per episode, in TRL's `environment_factory` contract: built with no arguments,
    `reset(**row)` per episode, the tool `guess`, and `get_reward()` at the end."""

    def __init__(self):
        self._target, self._low, self._high, self._max_guesses = None, LOW, HIGH, MAX_GUESSES
        self._guesses, self._found = 0, False

    def reset(self, target: int, low: int = LOW, high: int = HIGH, max_guesses: int = MAX_GUESSES, **row) -> None:
        """Start a game for a dataset row (its other columns, the prompt among them, are ignored).
        Returns None: the prompt already says everything the model needs."""
        target, low, high, max_guesses = int(target), int(low), int(high), int(max_guesses)
        if not low <= target <= high:
            raise ValueError(f"guess_number: target {target} is outside the range {low}..{high}")
        if max_guesses < 1:
            raise ValueError(f"guess_number: max_guesses must be at least 1, got {max_guesses}")
        self._target, self._low, self._high, self._max_guesses = target, low, high, max_guesses
        self._guesses, self._found = 0, False

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: The guess, an integer in the range the prompt names.

        Returns:
            "higher" if the secret number is higher than the guess, "lower" if it is lower,
            "correct" if the guess is the number; "out of range" or "not a number" for a guess
            that cannot be right, and "no guesses left" once the game is over.
        """
        if self._target is None:
            raise RuntimeError("guess_number: call reset(target=...) before guess()")
        if self._found or self._guesses >= self._max_guesses:
            return "no guesses left"
        self._guesses += 1
        value = _as_int(number)
        if value is None:
            return "not a number"
        if not self._low <= value <= self._high:
            return "out of range"
        if value == self._target:
            self._found = True
            return "correct"
        return "higher" if self._target > value else "lower"

    def get_reward(self) -> float:
        """1.0 when the number was found within max_guesses guesses, else 0.0."""
        return 1.0 if self._found else 0.0


def _as_int(number) -> int | None:
    """An integer from an int, an integral float or a string of digits (what a tag holds)."""
    if isinstance(number, bool):
        return None
    if isinstance(number, int):
        return number
    if isinstance(number, float):
        return int(number) if number.is_integer() else None
    try:
        return int(str(number).strip())
    except ValueError:
        return None


# ---------------------------------------------------------------------------- the verifier


def _guesses_in_text(text: str) -> list[tuple[str, str | None]]:
    """[(guess, the `<result>` right after its `</guess>`, or None)], as the regex
    `<guess>(.*?)</guess>\\s*(?:<result>(.*?)</result>)?` would find them, but in one linear pass
    (that regex takes minutes on 50 KB of unclosed `<guess>` tags)."""
    closes = {tag: [m.start() for m in re.finditer(re.escape(tag), text)] for tag in ("</guess>", RESULT_CLOSE)}
    out, pos = [], 0
    for m in re.finditer("<guess>", text):
        if m.start() < pos:
            continue
        k = bisect.bisect_left(closes["</guess>"], m.end())
        if k == len(closes["</guess>"]):
            break
        end = closes["</guess>"][k]
        guess, pos, reply = text[m.end() : end], end + len("</guess>"), None
        space = re.compile(r"\s*").match(text, pos)
        assert space is not None, "\\s* matches the empty string"
        after = space.end()
        if text.startswith(RESULT_OPEN, after):
            r = bisect.bisect_left(closes[RESULT_CLOSE], after + len(RESULT_OPEN))
            if r < len(closes[RESULT_CLOSE]):
                reply, pos = text[after + len(RESULT_OPEN) : closes[RESULT_CLOSE][r]], closes[RESULT_CLOSE][r] + len(RESULT_CLOSE)
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
            if reply.startswith(RESULT_OPEN) and reply.endswith(RESULT_CLOSE):
                reply = reply[len(RESULT_OPEN) : -len(RESULT_CLOSE)].strip()
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
        won = any(reply == "correct" and (t is None or _same_number(guess, t)) for guess, reply in _guess_rounds(c)[:k])
        out.append(float(won))
    return out


def make_task(o: TaskOptions) -> Task:
    """1..30 in 5 guesses; evaluation plays every target once (at most eval_size of them, evenly spread)."""
    return Task(
        name="guess_number",
        train_row=lambda i: train_row(i, seed=o.seed),
        eval_rows=lambda: eval_rows(o.eval_size),
        reward="guessed",
        max_new_tokens=240,  # five guesses and their replies
        tools={"environment": "guess_number", "format": "tags", "max_turns": 6},
    )


REWARDS = {"guessed": guessed}
ENVIRONMENTS = {"guess_number": GuessNumber}
