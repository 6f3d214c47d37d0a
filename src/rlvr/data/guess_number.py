"""The built-in `guess_number` task: find a secret number in a few guesses, told higher or lower.

A row is `{"prompt": [{"role": "user", "content": "Guess my number from 1 to 30."}], "target": 17,
"low": 1, "high": 30, "max_guesses": 5}`; every column but the prompt reaches the environment's
`reset(**row)` (`rlvr.envs.guess_number.GuessNumber`) and the reward functions. The game, its
replies and the tag protocol are documented there; the built-in `guessed` reward reads the
conversation and pays 1.0 when a guess of the target was answered `correct` within `max_guesses`
guesses (what evaluation uses; during training the environment's `get_reward` says the
same).

Training draws targets uniformly from the whole range, and evaluation plays every target of the
range once (greedy): success over the game, not over unseen secrets. A split by target does not
measure strategy: a policy can learn never to guess numbers that were never the answer. Measured
(bench/results/tools_demo.md): trained on 21 of the 30 targets, the bundled tiny-tools model went
to greedy success 0.95 on those and 0.00 on the other 9. Bisection always wins when
2**max_guesses > high - low + 1.
"""

from __future__ import annotations

import random

LOW, HIGH, MAX_GUESSES = 1, 30, 5  # the defaults (the environment's too)


def prompt_text(low: int = LOW, high: int = HIGH) -> str:
    return f"Guess my number from {low} to {high}."


def row(target: int, *, low: int = LOW, high: int = HIGH, max_guesses: int = MAX_GUESSES) -> dict:
    """A dataset row: the prompt as chat messages, the secret number and the game's knobs."""
    return {"prompt": [{"role": "user", "content": prompt_text(low, high)}], "target": int(target),
            "low": low, "high": high, "max_guesses": max_guesses}


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
