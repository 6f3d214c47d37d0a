"""The built-in `code` task: write one short Python function from a specification; hidden unit tests grade it.

A problem is an *instance* of a *family*: the family fixes what the function does up to a few
parameters (`scale_list`: multiply every element by k), the instance picks them (k = 3). Families
come in four categories (strings, lists, arithmetic, parsing). A row:

    {"prompt": [{"role": "user", "content": "Write a Python function `scale_list(xs)` that returns ..."}],
     "tests": "assert scale_list([4, -2]) == [12, -6]\\n...", "entry_point": "scale_list",
     "family": "scale_list", "category": "lists", "split": "train"}

The prompt gives one worked call; the tests use other inputs and are never shown. Scored by the
built-in `code` reward (fraction of tests passed in the sandbox, or all-or-nothing).

Held out, two ways, decided by the problem itself and never by the seed:
- `new_family`: every instance of the families in `HELD_OUT_FAMILIES` (one per category): a kind of
  function never trained on;
- `new_instance`: parameter choices of the training families that training never uses (a fixed
  share of each family's parameter space, at least one per family).
`eval_rows` mixes both (half each); the `split` column says which a row belongs to.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass

from rlvr.tasks.code.families import CATEGORIES, FAMILIES, FAMILY, HELD_OUT_FAMILIES, Family

__all__ = [
    "CATEGORIES",
    "FAMILIES",
    "FAMILY",
    "HELD_OUT_FAMILIES",
    "Family",
    "Problem",
    "eval_rows",
    "make_task",
    "problem_at",
    "train_row",
]
from rlvr.tasks.task import Task, TaskOptions

TESTS_PER_PROBLEM = 5  # random hidden tests; plus up to 3 fixed ones per family at the edges (`Family.edges`)
HELD_OUT_INSTANCE_PERCENT = 25  # of each training family's parameter space
INSTRUCTION = "Reply with the function in a ```python code block."


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def held_out_instances(family: Family) -> frozenset[int]:
    """Indices into `family.space` that training never uses: the HELD_OUT_INSTANCE_PERCENT of the space
    whose hash is lowest (at least one, never all)."""
    return _HELD_OUT_INSTANCES[family.name]


def _ranked_held_out(family: Family) -> frozenset[int]:
    ranked = sorted(range(len(family.space)), key=lambda i: _digest(f"{family.name}:{sorted(family.space[i].items())}"))
    n = min(len(ranked) - 1, max(1, len(ranked) * HELD_OUT_INSTANCE_PERCENT // 100))
    return frozenset(ranked[:n])


_HELD_OUT_INSTANCES = {f.name: _ranked_held_out(f) for f in FAMILIES}


@dataclass(frozen=True)
class Problem:
    family: Family
    params: dict
    example: tuple  # the worked call in the prompt
    tests: tuple[tuple, ...]  # the hidden tests' arguments

    @property
    def signature(self) -> str:
        return f"{self.family.name}({self.family.args})"

    def answer(self, args: tuple):
        return self.family.solve(self.params, *args)

    def call(self, args: tuple) -> str:
        return f"{self.family.name}({', '.join(map(repr, args))})"

    @property
    def question(self) -> str:
        what = self.family.spec.format(**self.params)
        return (
            f"Write a Python function `{self.signature}` that {what}.\n"
            f"For example, {self.call(self.example)} should return {self.answer(self.example)!r}.\n{INSTRUCTION}"
        )

    @property
    def test_code(self) -> str:
        return "\n".join(f"assert {self.call(args)} == {self.answer(args)!r}" for args in self.tests)

    def row(self, split: str) -> dict:
        return {
            "prompt": [{"role": "user", "content": self.question}],
            "tests": self.test_code,
            "entry_point": self.family.name,
            "family": self.family.name,
            "category": self.family.category,
            "split": split,
        }


def split_of(family: Family, params_index: int) -> str:
    """`new_family`, `new_instance` or `train`: which split a (family, parameters) pair belongs to."""
    if family.name in HELD_OUT_FAMILIES:
        return "new_family"
    return "new_instance" if params_index in held_out_instances(family) else "train"


def _problem(rng: random.Random, family: Family, params_index: int) -> Problem:
    params = family.space[params_index]
    edges = list(family.edges(params))
    calls: list[tuple] = []
    for _ in range(50 * (TESTS_PER_PROBLEM + 1)):  # distinct calls: the example is never one of the tests
        args = family.inputs(rng, params)
        if args not in calls and args not in edges:
            calls.append(args)
        if len(calls) == TESTS_PER_PROBLEM + 1:
            break
    return Problem(family, params, calls[0], tuple(calls[1:] + edges))


# split -> {family name: the parameter indices of that split}
_SPLITS: dict[str, dict[str, list[int]]] = {}
for _f in FAMILIES:
    for _i in range(len(_f.space)):
        _SPLITS.setdefault(split_of(_f, _i), {}).setdefault(_f.name, []).append(_i)


def problem_at(index: int, split: str, *, seed: int) -> Problem:
    """Problem number `index` of a split ("train", "new_family", "new_instance"): random access, so a run resumes
    exactly. Families are drawn evenly, then parameters, then test inputs."""
    if split not in ("train", "new_family", "new_instance"):
        raise ValueError(f"split must be 'train', 'new_family' or 'new_instance', got {split!r}")
    rng = random.Random(f"code:{split}:{seed}:{index}")
    family = FAMILY[rng.choice(sorted(_SPLITS[split]))]
    return _problem(rng, family, rng.choice(_SPLITS[split][family.name]))


def train_row(index: int, *, seed: int) -> dict:
    return problem_at(index, "train", seed=seed).row("train")


def eval_rows(size: int) -> list[dict]:
    """`size` held-out problems, alternating new families and new instances of training families (fixed: seed 0)."""
    return [problem_at(i // 2, split, seed=0).row(split) for i, split in zip(range(size), itertools.cycle(("new_family", "new_instance")))]


def make_task(o: TaskOptions) -> Task:
    """Scored by the built-in `code` reward (rlvr.rewards.code_exec), all tests or nothing."""
    return Task(
        name="code",
        train_row=lambda i: train_row(i, seed=o.seed),
        eval_rows=lambda: eval_rows(o.eval_size),
        reward="code(all_or_nothing=True)",
        max_new_tokens=256,
    )
