"""Guess the number: the environment of the built-in `guess_number` task.

The model has `max_guesses` calls of `guess(number)` to find a secret integer in [low, high].
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
"""

from __future__ import annotations

LOW, HIGH, MAX_GUESSES = 1, 30, 5  # the defaults


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
