"""Adding a built-in task is one module and one line in rlvr.tasks.TASKS: a small task defined here is then a
`data.task` name, trains, is evaluated on its own held-out rows by its own verifier, and its verifier and
environment are built-in names, with nothing else edited."""

from __future__ import annotations

import importlib
import json
import textwrap

import pytest

from rlvr.config import ConfigError, load_config
from rlvr.tasks import ENVIRONMENTS, REWARDS, TASKS

# The whole task: rows by index, a held-out split, its verifier and an environment, as a task module writes them.
COUNT_UP = '''
"""count_up: the number after n (n < 80 is trained on, 80..99 is held out)."""

from rlvr.tasks import Task, TaskOptions


def row(n: int) -> dict:
    return {"prompt": f"{n}+1=", "following": str(n + 1)}


SCORED = []  # how many completions each call scored (the test reads it)


def says_following(prompts, completions, following, **kwargs) -> list[float]:
    SCORED.append(len(completions))
    return [float(c.strip() == f) for c, f in zip(completions, following)]


class Counter:
    """An environment: count on from the row's number."""

    def reset(self, following: str, **row) -> None:
        self.at = int(following)

    def next(self) -> str:
        """The number after the last one."""
        self.at += 1
        return str(self.at)


def make_task(o: TaskOptions) -> Task:
    return Task(name="count_up", train_row=lambda i: row((o.seed + 7 * i) % 80),
                eval_rows=lambda: [row(80 + k) for k in range(o.eval_size)], reward="says_following")


REWARDS = {"says_following": says_following}
ENVIRONMENTS = {"counter": Counter}
'''


@pytest.fixture
def count_up(tmp_path, monkeypatch):
    """The task module on the path, and its line in TASKS (undone after the test)."""
    (tmp_path / "count_up_task.py").write_text(textwrap.dedent(COUNT_UP))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("count_up_task")
    monkeypatch.setitem(TASKS, "count_up", module)
    return module


def test_a_task_is_unknown_until_its_registry_line(tiny_model_dir, tmp_path):
    from rlvr.training.setup import check_config

    with pytest.raises(ConfigError, match=r"`data.task` must be one of .*got 'count_up'"):
        check_config(load_config(None, ["data.task=count_up"]))
    assert "says_following" not in REWARDS and "counter" not in ENVIRONMENTS


def test_a_task_added_to_the_registry_trains_and_is_evaluated(count_up, make_trainer, tmp_path):
    from rlvr.tools import load_environment

    assert REWARDS["says_following"] == "count_up_task:says_following"
    assert load_environment("counter") is count_up.Counter  # tools.environment=counter names it
    trainer = make_trainer(
        "data.task=count_up", "steps=1", "eval_before_after=true", "data.eval_size=3", "log_completions_every=1", "rewards=[says_following]"
    )
    summary = trainer.train()
    run = tmp_path / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and "rewards/says_following/mean" in metrics[0]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    prompts = {s["prompt"][-1]["content"] if isinstance(s["prompt"], list) else s["prompt"] for s in samples}
    assert prompts and all(p.endswith("+1=") and int(p[:-3]) < 80 for p in prompts)  # training rows, none held out
    # its own verifier scored the held-out rows (3 greedy completions) before and after, and the 4 x 4 of the step
    assert sorted(count_up.SCORED) == [3, 3, 16] and summary["eval_label"] == "accuracy"
    assert {"eval_before", "eval_after"} <= set(summary)
    assert trainer.held_out.rows == [{"prompt": f"{n}+1=", "following": str(n + 1)} for n in (80, 81, 82)]
