"""RewardRunner: concurrency, and isolation of reward functions that misbehave."""

from __future__ import annotations

import asyncio
import threading
import logging
import math
import time
from dataclasses import dataclass

import pytest
import torch

from rlvr.rewards import RewardError, RewardFn, RewardRunner, load_reward_fn


def ones(prompts, completions, **kw):
    return [1.0] * len(completions)


def raises(prompts, completions, **kw):
    raise ValueError("grader bug")


def wrong_count(prompts, completions, **kw):
    return [1.0]


def not_numbers(prompts, completions, **kw):
    return ["high", None, float("inf"), torch.tensor(0.5)]


def hangs(prompts, completions, **kw):
    time.sleep(3)
    return [1.0] * len(completions)


def runner(*fns, **options):
    return RewardRunner([RewardFn(f.__name__, f, 1.0) for f in fns], **options)


def test_misbehaving_functions_are_isolated_and_counted(caplog):
    r = runner(ones, raises, wrong_count, not_numbers, hangs, timeout_s=0.5)
    with caplog.at_level(logging.WARNING, logger="rlvr.rewards"):
        start = time.monotonic()
        out = r(["p"] * 4, ["a", "b", "c", "d"], {})
        assert time.monotonic() - start < 1.5  # the hanging function does not hold up training
        r(["p"] * 4, ["a", "b", "c", "d"], {})
    assert out.shape == (4, 5) and out.dtype == torch.float64
    assert out[:, 0].tolist() == [1.0] * 4
    assert all(math.isnan(v) for v in out[:, 1:3].flatten().tolist() + out[:, 4].tolist())
    assert [math.isnan(v) for v in out[:, 3].tolist()] == [True, True, True, False] and out[3, 3] == 0.5
    assert r.last_errors == {"ones": 0, "raises": 4, "wrong_count": 4, "not_numbers": 2, "hangs": 4}
    assert r.total_errors["raises"] == 8
    tracebacks = [rec for rec in caplog.records if "'raises' failed" in rec.getMessage()]
    assert len(tracebacks) == 1 and "grader bug" in tracebacks[0].getMessage()  # logged once


def test_on_error_zero():
    out = runner(raises, ones, on_error="zero")(["p"] * 2, ["a", "b"], {})
    assert out.tolist() == [[0.0, 1.0], [0.0, 1.0]]
    with pytest.raises(RewardError):
        runner(ones, on_error="ignore")


def test_sync_functions_run_concurrently_and_async_ones_are_awaited_together():
    def slow_a(prompts, completions, **kw):
        time.sleep(0.4)
        return [0.1] * len(completions)

    def slow_b(prompts, completions, **kw):
        time.sleep(0.4)
        return [0.2] * len(completions)

    async def judge_a(prompts, completions, **kw):
        await asyncio.sleep(0.4)
        return [0.3] * len(completions)

    async def judge_b(prompts, completions, **kw):
        await asyncio.sleep(0.4)
        return [0.4] * len(completions)

    r = runner(slow_a, slow_b, judge_a, judge_b)
    start = time.monotonic()
    out = r(["p"], ["a"], {})
    assert time.monotonic() - start < 0.75  # 4 x 0.4 s sequentially would be 1.6 s
    assert out.tolist() == [[0.1, 0.2, 0.3, 0.4]]


def test_columns_and_extras_reach_only_functions_that_take_them():
    def strict(prompts, completions, answer):
        return [float(c == a) for c, a in zip(completions, answer)]

    def greedy(prompts, completions, **kw):
        return [float(len(kw["completion_ids"][i])) for i in range(len(completions))]

    out = runner(strict, greedy)(["p"] * 2, ["4", "5"], {"answer": ["4", "4"], "other": [1, 2]}, completion_ids=[[1], [1, 2]])
    assert out.tolist() == [[1.0, 1.0], [0.0, 2.0]]


@dataclass
class Spec:
    fn: str
    weight: float = 1.0
    name: str | None = None


def test_from_config_builds_parameterised_builtins():
    r = RewardRunner.from_config([Spec("math"), Spec("format_strict", 0.5), Spec("overlong(max_length=4, buffer=2)", 1.0, "long")])
    assert r.names == ["math", "format_strict", "long"]
    assert r.weights.tolist() == [1.0, 0.5, 1.0]
    out = r(["p"], ["<think>\nx\n</think>\n<answer>\n4\n</answer>"], {"answer": ["4"]}, completion_ids=[[0, 0, 0]])
    assert out.tolist() == [[1.0, 1.0, -0.5]]
    for bad in ("overlong(4)", "format_strict(x=1)", "nope", "overlong(max_length=__import__('os'))"):
        with pytest.raises(RewardError):
            RewardRunner.from_config([Spec(bad)])


def test_a_misspelt_reward_name_gets_the_nearest_one(tmp_path, monkeypatch):
    """A typo names the spec and the nearest name: among the built-ins for a bare name, among the
    module's public functions for `file.py:fn` and `module:fn`; nothing close, no suggestion."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.py").write_text(
        "import math\n\ndef correct(prompts, completions, **kw):\n    return [1.0] * len(completions)\n\ndef _correct_helper():\n    pass\n"
    )
    cases = [
        ("mth", r"reward 'mth': use a built-in name \(.*\).* \(did you mean 'math'\?\)$"),
        ("format_stritc(x=1)", r"reward 'format_stritc\(x=1\)': .* \(did you mean 'format_strict'\?\)$"),
        ("my.py:corect", r"reward 'my.py:corect': my.py has no function 'corect' \(did you mean 'correct'\?\)$"),
        ("rlvr.tasks.guess_number:gessed", r"has no function 'gessed' \(did you mean 'guessed'\?\)$"),
        ("my.py:zzz", r"reward 'my.py:zzz': my.py has no function 'zzz'$"),
    ]
    for spec, message in cases:
        with pytest.raises(RewardError, match=message):
            load_reward_fn(spec)
    assert load_reward_fn("my.py:correct")(None, ["a", "b"]) == [1.0, 1.0]


# ------------------------------------------------------------------ TRL 1.16's calling contract


def test_trl_keywords_trainer_state_log_metric_and_log_extra():
    """Called as TRL's GRPOTrainer calls reward functions: trainer_state, log_metric, log_extra."""
    seen = {}

    def curriculum(prompts, completions, trainer_state, log_metric, log_extra, **kwargs):  # TRL's docs' shape
        seen["step"], seen["max_steps"] = trainer_state.global_step, trainer_state.max_steps
        log_metric("curriculum/level", 2.0)
        log_metric("curriculum/level", 4.0)
        log_extra("bucket", ["short" if len(c) < 2 else "long" for c in completions])
        return [float(len(c)) for c in completions]

    def positional_only(prompts, completions, answer):  # names none of them: gets none of them
        return [0.0] * len(completions)

    r = runner(curriculum, positional_only)
    r.state.global_step, r.state.max_steps = 7, 10
    out = r(["p"] * 2, ["a", "bcd"], {"answer": ["1", "2"]})
    assert out.tolist() == [[1.0, 0.0], [3.0, 0.0]]
    assert seen == {"step": 7, "max_steps": 10}
    assert r.last_logged_columns == {"bucket": ["short", "long"]}
    assert r.take_logged_metrics() == {"curriculum/level": [2.0, 4.0]}
    assert r.take_logged_metrics() == {}  # taken once
    assert r.last_errors == {"curriculum": 0, "positional_only": 0}


def test_log_extra_with_the_wrong_length_fails_that_function_only():
    def bad_extra(prompts, completions, log_extra, **kwargs):
        log_extra("col", [1])
        return [1.0] * len(completions)

    r = runner(bad_extra, ones)
    out = r(["p"] * 3, ["a", "b", "c"], {})
    assert r.last_errors == {"bad_extra": 3, "ones": 0} and out[:, 1].tolist() == [1.0] * 3
    assert "1 values for 3 completions" in r.first_error["bad_extra"] and "test_reward_runner.py" in r.first_error["bad_extra"]


def test_a_function_past_its_time_is_stopped_not_left_computing():
    """A pure-Python loop cannot be killed, but it is interrupted: no thread keeps running after."""
    progress = []

    def spins(prompts, completions, **kwargs):
        while True:
            progress.append(1)
            sum(range(1000))

    def spinning_threads():
        # By name: other tests' idle tool workers end on their own timer, so the set of all threads moves.
        return [t for t in threading.enumerate() if t.name == "rlvr-reward-spins" and t.is_alive()]

    assert spinning_threads() == []
    r = runner(spins, ones, timeout_s=0.3)
    out = r(["p"], ["a"], {})
    assert math.isnan(out[0, 0]) and out[0, 1] == 1.0 and r.last_errors["spins"] == 1
    assert "TimeoutError" in r.first_error["spins"]
    assert spinning_threads() == []  # the spinning thread ended
    n = len(progress)
    time.sleep(0.2)
    assert len(progress) == n  # and computes nothing more
