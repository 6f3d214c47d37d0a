"""The built-in `arithmetic` task: prompts generated from a seed, a held-out split, a verifier (the
built-in `arithmetic` reward).

A problem is `a op b` with operands of `digits` digits and `op` drawn from `operators`.
Which problems are held out is decided by a hash of the problem itself, not by the seed,
so no seed and no amount of training data can leak an evaluation problem into training. For
`+` and `*` the hash is of the unordered pair: `a+b` and `b+a` are one problem, held out together.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Iterator

from rlvr.rewards.text import completion_text
from rlvr.tasks.task import Task, TaskOptions

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
COMMUTATIVE = frozenset("+*")
HELD_OUT_PERCENT = 10  # share of all problems reserved for evaluation


@dataclass(frozen=True)
class Problem:
    a: int
    op: str
    b: int

    @property
    def question(self) -> str:
        return f"{self.a}{self.op}{self.b}="

    @property
    def answer(self) -> int:
        return OPERATORS[self.op](self.a, self.b)

    def row(self) -> dict:
        """A dataset row: the prompt as chat messages, plus the ground truth for rewards."""
        return {"prompt": [{"role": "user", "content": self.question}], "answer": str(self.answer)}


def is_held_out(p: Problem) -> bool:
    """Swapped operands of a commutative operator are the same problem: the pair is held out as one."""
    a, b = (min(p.a, p.b), max(p.a, p.b)) if p.op in COMMUTATIVE else (p.a, p.b)
    digest = hashlib.blake2b(f"{a}{p.op}{b}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % 100 < HELD_OUT_PERCENT


def _check_knobs(digits: int, operators: str) -> None:
    if not 1 <= digits <= 6:
        raise ValueError(f"data.digits must be between 1 and 6, got {digits}")
    bad = [o for o in operators if o not in OPERATORS]
    if not operators or bad:
        raise ValueError(f"data.operators must be a non-empty string of {''.join(OPERATORS)}, got {operators!r}")


def random_problem(rng: random.Random, digits: int, operators: str) -> Problem:
    lo = 0 if digits == 1 else 10 ** (digits - 1)
    a, b = rng.randint(lo, 10**digits - 1), rng.randint(lo, 10**digits - 1)
    op = rng.choice(operators)
    if op == "-" and b > a:  # keep answers non-negative: fewer tokens to learn, same skill
        a, b = b, a
    return Problem(a, op, b)


def problem_at(index: int, split: str, *, seed: int, digits: int = 2, operators: str = "+-") -> Problem:
    """Problem number `index` of a split's endless stream: random access, so a run resumes exactly."""
    _check_knobs(digits, operators)
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(f"{seed}:{index}")
    while True:  # rejection keeps the two splits disjoint
        p = random_problem(rng, digits, operators)
        if is_held_out(p) == (split == "test"):
            return p


def problems(split: str, *, seed: int, digits: int = 2, operators: str = "+-") -> Iterator[Problem]:
    """An endless stream of problems of one split ("train" or "test"), reproducible from seed."""
    index = 0
    while True:
        yield problem_at(index, split, seed=seed, digits=digits, operators=operators)
        index += 1


def eval_problems(n: int, *, digits: int = 2, operators: str = "+-", seed: int = 1234) -> list[Problem]:
    """The held-out evaluation set: n distinct problems, the same for every run with the same knobs."""
    out: list[Problem] = []
    seen: set[Problem] = set()
    misses = 0
    for p in problems("test", seed=seed, digits=digits, operators=operators):
        if p in seen:
            misses += 1
            if misses > 20_000:  # the held-out split of these knobs is smaller than n
                raise ValueError(
                    f"data.eval_size={n} is more than the {len(out)} distinct held-out problems with "
                    f"digits={digits}, operators={operators!r}: lower data.eval_size or raise data.digits"
                )
            continue
        seen.add(p)
        out.append(p)
        if len(out) == n:
            return out
    raise AssertionError("unreachable")


_INTEGER = re.compile(r"\s*(-?\d+)\s*")
MAX_ANSWER_DIGITS = 40


def extract_answer(completion: str) -> str | None:
    """The answer, when the completion is one integer and nothing else.

    Strict on purpose: a completion listing several numbers must not earn the reward.
    """
    m = _INTEGER.fullmatch(completion)
    return m.group(1) if m else None


def is_correct(completion: str, answer: str | int) -> bool:
    got = extract_answer(completion)
    # a 50 KB "answer" is wrong, not an error (int() refuses more than 4300 digits)
    return got is not None and len(got) <= MAX_ANSWER_DIGITS and int(got) == int(answer)


def arithmetic_correct(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion is exactly the integer in the `answer` column, else 0.0.

    >>> arithmetic_correct(["12+30="], ["42"], answer=["42"])
    [1.0]
    """
    return [float(is_correct(completion_text(c), a)) for c, a in zip(completions, answer)]


def _answer_given(completion) -> str | None:
    """The integer the completion answers, as a comparable string (held-out maj@k votes on it)."""
    got = extract_answer(completion_text(completion))
    return str(int(got)) if got is not None and len(got) <= MAX_ANSWER_DIGITS else None


arithmetic_correct.extract_answer = _answer_given  # type: ignore[attr-defined]


def make_task(o: TaskOptions) -> Task:
    return Task(
        name="arithmetic",
        train_row=lambda i: problem_at(i, "train", seed=o.seed, digits=o.digits, operators=o.operators).row(),
        eval_rows=lambda: [p.row() for p in eval_problems(o.eval_size, digits=o.digits, operators=o.operators)],
        reward="arithmetic",
    )


REWARDS = {"arithmetic": arithmetic_correct}
