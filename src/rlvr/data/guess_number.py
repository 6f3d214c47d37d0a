"""The built-in `guess_number` task: find a secret number in a few guesses, told higher or lower.

A row is `{"prompt": [{"role": "user", "content": "Guess my number from 1 to 30."}], "target": 17,
"low": 1, "high": 30, "max_guesses": 5}`; every column but the prompt reaches the environment's
`reset(**row)` (`rlvr.envs.guess_number.GuessNumber`) and the reward functions. The game, its
replies and the tag protocol are documented there; the built-in `guessed` reward reads the
conversation and pays 1.0 when a guess of the target was answered `correct` within `max_guesses`
guesses (what held-out evaluation uses; during training the environment's `get_reward` says the
same).

A range has few targets (30 by default), so the held-out split is a fixed share of the targets
themselves: the 30% whose hash is smallest (9 of 1..30), never trained on; evaluation plays each
of them once. Bisection always wins when 2**max_guesses > high - low + 1.
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache

LOW, HIGH, MAX_GUESSES = 1, 30, 5  # the defaults (the environment's too)
HELD_OUT_SHARE = 0.3


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


def held_out_targets(low: int = LOW, high: int = HIGH) -> list[int]:
    """The evaluation targets of a range, ascending: a fixed share chosen by hash, at least one,
    never all."""
    _check(low, high, MAX_GUESSES)
    return list(_held_out(low, high))


@lru_cache(maxsize=64)
def _held_out(low: int, high: int) -> tuple[int, ...]:
    targets = list(range(low, high + 1))
    count = min(len(targets) - 1, max(1, round(HELD_OUT_SHARE * len(targets))))

    def digest(t: int) -> bytes:
        return hashlib.blake2b(f"guess:{low}-{high}:{t}".encode(), digest_size=8).digest()

    return tuple(sorted(sorted(targets, key=digest)[:count]))


def train_targets(low: int = LOW, high: int = HIGH) -> list[int]:
    held = set(held_out_targets(low, high))
    return [t for t in range(low, high + 1) if t not in held]


def target_at(index: int, *, seed: int, low: int = LOW, high: int = HIGH) -> int:
    """Training target number `index`: uniform over the training targets; random access, so a run
    resumes exactly."""
    return random.Random(f"guess_number:{seed}:{index}").choice(train_targets(low, high))


def train_row(index: int, *, seed: int, low: int = LOW, high: int = HIGH, max_guesses: int = MAX_GUESSES) -> dict:
    _check(low, high, max_guesses)
    return row(target_at(index, seed=seed, low=low, high=high), low=low, high=high, max_guesses=max_guesses)


def eval_rows(n: int, *, low: int = LOW, high: int = HIGH, max_guesses: int = MAX_GUESSES) -> list[dict]:
    """The held-out evaluation set: each held-out target once, at most n of them."""
    _check(low, high, max_guesses)
    return [row(t, low=low, high=high, max_guesses=max_guesses) for t in held_out_targets(low, high)[:n]]
