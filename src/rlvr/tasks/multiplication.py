"""The built-in `multiplication` task: products too long to do in the head, made for a calculator tool.

A problem is `a*b` with `a` of 3 digits and `b` of 2 or 3 digits (even odds). The prompt row is
`{"prompt": [{"role": "user", "content": "123*45="}], "answer": "5535"}`; with the bundled
`tiny-tools` model and its character-level chat template it renders as
`<|user|>123*45=<|assistant|>`. The episodes the tag protocol expects after it:

    <calc>123*45</calc><result>5535</result>5535</s>     a calculator call, its result, the answer
    5535</s>                                             a direct answer (rarely right for a small model)

Only the model's text is trained; `<result>...</result>` is written by the calculator. The
answer is checked by the built-in `final_answer` reward, defined here (the model's last turn, exactly).

Which problems are held out is decided by a hash of the problem itself (the `arithmetic` task's
for `*`: of the unordered pair, so `a*b` and `b*a` are held out together), not by the seed, so no
seed and no amount of training data can leak an evaluation problem into training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator

from rlvr.rewards.text import completion_text
from rlvr.tasks import arithmetic
from rlvr.tasks.task import RESULT_CLOSE, Task, TaskOptions

A_DIGITS = 3
B_DIGITS = (2, 3)  # digits of the second operand, drawn with even odds


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    @property
    def expression(self) -> str:
        """What a calculator call holds: `123*45`."""
        return f"{self.a}*{self.b}"

    @property
    def question(self) -> str:
        return f"{self.a}*{self.b}="

    @property
    def answer(self) -> int:
        return self.a * self.b

    def row(self) -> dict:
        """A dataset row: the prompt as chat messages, plus the ground truth for rewards."""
        return {"prompt": [{"role": "user", "content": self.question}], "answer": str(self.answer)}


def is_held_out(p: Problem) -> bool:
    return arithmetic.is_held_out(arithmetic.Problem(p.a, "*", p.b))


def random_problem(rng: random.Random) -> Problem:
    a = rng.randint(10 ** (A_DIGITS - 1), 10**A_DIGITS - 1)
    digits = rng.choice(B_DIGITS)
    b = rng.randint(10 ** (digits - 1), 10**digits - 1)
    return Problem(a, b)


def problem_at(index: int, split: str, *, seed: int) -> Problem:
    """Problem number `index` of a split's endless stream: random access, so a run resumes exactly."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(f"multiplication:{seed}:{index}")
    while True:  # rejection keeps the two splits disjoint
        p = random_problem(rng)
        if is_held_out(p) == (split == "test"):
            return p


def problems(split: str, *, seed: int) -> Iterator[Problem]:
    """An endless stream of problems of one split ("train" or "test"), reproducible from seed."""
    index = 0
    while True:
        yield problem_at(index, split, seed=seed)
        index += 1


def eval_problems(n: int, *, seed: int = 1234) -> list[Problem]:
    """The held-out evaluation set: n distinct problems, the same for every run (about 89,000 exist)."""
    out, seen = [], set()
    for p in problems("test", seed=seed):
        if p not in seen:
            seen.add(p)
            out.append(p)
            if len(out) == n:
                return out
    raise AssertionError("unreachable")


def final_answer_text(completion) -> str:
    """The model's final answer: the last assistant message's text after its last `</result>`
    (the whole of it when there is none), stripped. Plain text counts as one assistant message."""
    if isinstance(completion, (list, tuple)):
        assistant = [m for m in completion if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
        text = str(assistant[-1].get("content") or "") if assistant else ""
    else:
        text = completion_text(completion)
    return text.rsplit(RESULT_CLOSE, 1)[-1].strip()


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


final_answer.extract_answer = lambda completion: final_answer_text(completion) or None  # type: ignore[attr-defined]  # maj@k


def make_task(o: TaskOptions) -> Task:
    """Fixed operand sizes (3 by 2-3 digits): `digits` and `operators` do not apply."""
    return Task(
        name="multiplication",
        train_row=lambda i: problem_at(i, "train", seed=o.seed).row(),
        eval_rows=lambda: [p.row() for p in eval_problems(o.eval_size)],
        reward="final_answer",
        max_new_tokens=64,  # a call, its result and the answer
        tools={"functions": ["calculator"], "tags": ["calculator=calc"], "format": "tags", "max_turns": 2},
    )


REWARDS = {"final_answer": final_answer}
