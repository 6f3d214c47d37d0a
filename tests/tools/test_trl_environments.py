"""TRL 1.16's environment code runs unchanged: reward functions get the episodes' environment instances
as `environments` (one per completion, in order), in training and in held-out evaluation; a reward
asking for them where there is no environment is refused with a pointer to get_reward(); and an
environment's own get_reward() can score eval.data, in training and in `rlvr eval`."""

from __future__ import annotations

import json

import pytest

from _calc_caller import save_calc_caller, write_rows
from rlvr.cli import main

ENV = '''
class CalcEnv:
    def reset(self, **kwargs) -> str | None:
        self.calls = 0
        self.answer = kwargs.get("answer")
        return None

    def get_reward(self) -> float:
        return float(self.calls == 1 and self.answer == "408")

    def multiply(self, expression: str) -> str:
        """
        Multiply two integers written as a*b.

        Args:
            expression: The product to compute, e.g. 12*34.

        Returns:
            The product.
        """
        self.calls += 1
        a, b = expression.split("*")
        return str(int(a) * int(b))


class BrokenEnv(CalcEnv):
    def get_reward(self) -> float:
        return 1 / 0


def called_once(environments, completions, **kwargs) -> list[float]:
    # TRL's contract: one fresh instance per completion, in the completions' order
    assert len(environments) == len(completions) == len({id(e) for e in environments}), "not one environment per completion"
    assert all(type(e).__name__ == "CalcEnv" for e in environments)
    return [float(env.calls == 1) for env in environments]
'''

FAST = [
    "rollout.group_size=4",
    "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=64",
    "steps=2",
    "threads=1",
    "report_to=[]",
    "model.autocast=none",
]


@pytest.fixture(scope="module")
def env_setup(tmp_path_factory):
    """(the calculator-calling model, env.py, 5 held-out rows of which get_reward() scores 3)."""
    where = tmp_path_factory.mktemp("trl_env")
    (where / "env.py").write_text(ENV)
    return save_calc_caller(where / "caller"), where / "env.py", write_rows(where / "held.jsonl", ["408"] * 3 + ["999"] * 2)


def _run(caller, env, held, out, *more) -> list[str]:
    return [
        f"output_dir={out}",
        f"model.path={caller}",
        f"data.path={caller / 'data.jsonl'}",
        f"eval.data={held}",
        f"tools.environment={env}:CalcEnv",
        "tools.tags=[multiply=calc]",
        "tools.format=tags",
        "tools.describe=false",
        *FAST,
        *more,
    ]


def rlvr(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main([str(a) for a in args])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_a_trl_reward_of_environments_trains_and_evaluates_unchanged(env_setup, rlvr_cli, tmp_path):
    caller, env, held = env_setup
    out = tmp_path / "run"
    rlvr_cli("train", *_run(caller, env, held, out, f"rewards=[{env}:called_once]"), check=True, timeout=300)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    seen = [(r["rewards/called_once/mean"], r["rewards/called_once/errors"], r["rewards/CalcEnv/mean"]) for r in rows]
    assert seen == [(1.0, 0, 1.0)] * 2
    summary = json.loads((out / "summary.json").read_text())  # eval.data scored by called_once: it got the eval episodes' environments
    assert (summary["eval_before"], summary["eval_after"], summary["eval_label"], summary["eval_rows"]) == (1.0, 1.0, "mean called_once", 5)


def test_an_environments_get_reward_scores_eval_data_in_training_and_in_rlvr_eval(env_setup, tmp_path, capsys):
    caller, env, held = env_setup
    out = tmp_path / "run"
    assert rlvr(capsys, "train", *_run(caller, env, held, out, "rewards=[]"))[0] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["eval_before"], summary["eval_after"], summary["eval_label"]) == (0.6, 0.6, "mean CalcEnv")  # 408 is right 3 times
    assert rlvr(capsys, "eval", out)[:2] == (
        0,
        f"[note] evaluating {out / 'final'} with {out / 'config.yaml'}: multi-turn with "
        f"environment {env}:CalcEnv (tools.format=tags, max_turns=4)\n"
        f"{held} held-out mean CalcEnv (5 rows, greedy): 0.600\n",
    )
    status, stdout, _ = rlvr(
        capsys,
        "eval",
        caller,
        "--data",
        held,
        "--environment",
        f"{env}:CalcEnv",
        "--tool-tags",
        "multiply=calc",
        "--tool-format",
        "tags",
        "--max-new-tokens",
        "64",
        "tools.describe=false",
    )  # any model; the environment scores
    assert status == 0 and f"{held} held-out mean CalcEnv (5 rows, greedy): 0.600" in stdout
    status, _, err = rlvr(
        capsys,
        "eval",
        caller,
        "--data",
        held,
        "--environment",
        f"{env}:BrokenEnv",
        "--tool-tags",
        "multiply=calc",
        "--tool-format",
        "tags",
        "--max-new-tokens",
        "64",
        "tools.describe=false",
    )
    assert status == 1 and err.strip().splitlines()[-1] == (
        "rlvr: error: no held-out score: the reward 'BrokenEnv' failed on every one of the 5 rows; "
        "its first error: BrokenEnv.get_reward(): ZeroDivisionError: division by zero"
    )


def test_a_reward_of_environments_without_an_environment_points_to_get_reward(env_setup, tmp_path, capsys):
    caller, env, held = env_setup
    message = (
        "rlvr: error: reward function 'called_once' takes `environments` (the episodes' environment instances, as TRL passes "
        "them with environment_factory), but no environment is set: set tools.environment (rlvr eval: --environment) to your "
        "environment class (file.py:Class), or, with one, let it score itself with a get_reward(self) method (rlvr adds it as "
        "a reward named after the class, as TRL does) instead of a reward function"
    )
    status, _, err = rlvr(
        capsys,
        "train",
        f"output_dir={tmp_path / 'run'}",
        f"model.path={caller}",
        f"data.path={caller / 'data.jsonl'}",
        f"rewards=[{env}:called_once]",
        *FAST,
    )
    assert status == 2 and err.strip().splitlines()[-1] == message
    status, _, err = rlvr(capsys, "eval", caller, "--data", held, "--reward", f"{env}:called_once")
    assert status == 2 and err.strip().splitlines()[-1] == message
