"""Built-in tasks, one module each holding its rows, its held-out split, its verifier and (where it has one) its
environment; `TASKS` names them.

| module | `data.task` | verifier (built-in reward) | environment |
|---|---|---|---|
| `arithmetic.py` | `a+b=` problems of `data.digits` digits | `arithmetic` | |
| `multiplication.py` | 3-digit products, made for a calculator tool | `final_answer` | |
| `guess_number.py` | find a number from higher / lower replies | `guessed` | `guess_number` |
| `code/` | write one Python function, hidden tests (families.py: the function families) | `code` (rlvr.rewards.code_exec) | |
| `humaneval.py` | OpenAI's HumanEval, for `rlvr eval --task` only | `code` | |
| `task.py` | `Task` and `TaskOptions`, what every task module builds | | |

A task module has `make_task(options: TaskOptions) -> Task` and may have `REWARDS` ({built-in reward name:
function}) and `ENVIRONMENTS` ({built-in environment name: class}). Adding a task is its module and one line in
`TASKS`: `data.task`, `rlvr eval --task`, the held-out evaluation, the reward names `rewards` accepts and the
environment names `tools.environment` accepts all read it from there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from rlvr.tasks import arithmetic, code, guess_number, humaneval, multiplication
from rlvr.tasks.task import Task, TaskOptions

TASKS = {  # data.task / rlvr eval --task name -> its module
    "arithmetic": arithmetic,
    "multiplication": multiplication,
    "guess_number": guess_number,
    "code": code,
    "humaneval": humaneval,
}


def get_task(name: str, *, seed: int, digits: int = 2, operators: str = "+-", eval_size: int = 500) -> Task:
    if name not in TASKS:
        raise ValueError(f"data.task: unknown task {name!r}; built-in tasks: {', '.join(TASKS)}")
    return TASKS[name].make_task(TaskOptions(seed=seed, digits=digits, operators=operators, eval_size=eval_size))


def training_tasks() -> list[str]:
    """The tasks `data.task` accepts: those with training rows (not the evaluation-only benchmarks)."""
    return [name for name in TASKS if get_task(name, seed=0).train_row is not None]


class _Declared(Mapping[str, str]):
    """The built-in names the task modules declare in their `attr` table, each as the `module:name` spec of its
    function or class; read from TASKS on every use, so a task added there is seen at once."""

    def __init__(self, attr: str):
        self.attr = attr

    def _table(self) -> dict[str, str]:
        return {
            name: f"{obj.__module__}:{obj.__qualname__}"
            for module in TASKS.values()
            for name, obj in getattr(module, self.attr, {}).items()
        }

    def __getitem__(self, name: str) -> str:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


REWARDS = _Declared("REWARDS")  # the tasks' verifiers: built-in reward names (besides rlvr.rewards.BUILTIN)
ENVIRONMENTS = _Declared("ENVIRONMENTS")  # the tasks' environments: built-in tools.environment names

__all__ = ["ENVIRONMENTS", "REWARDS", "TASKS", "Task", "TaskOptions", "get_task", "training_tasks"]
