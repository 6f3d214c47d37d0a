"""checkpoint.best_metric / greater_is_better / load_best_at_end (TRL's metric_for_best_model, greater_is_better,
load_best_model_at_end, save_strategy=best): each evaluation that improves on the best so far checkpoints its step,
checkpoint.keep never deletes that one, final/ gets its weights with load_best_at_end, and a resumed run goes on
comparing with the best before it."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from rlvr.config import ConfigError, load_config
from rlvr.models import resolve_model_path
from rlvr.training.run_control import TrainingError
from rlvr.training.setup import check_config

BEST = [
    f"model.path={resolve_model_path('tiny')}",  # the bundled model: its held-out accuracy moves from step to step
    "optim.lr=3e-3",
    "rollout.max_new_tokens=8",
    "data.eval_size=16",
    "eval.every=1",
    "checkpoint.best_metric=eval/reward",
    "checkpoint.keep=1",
]


def _scores(run) -> list[float]:
    return [json.loads(x)["eval/reward"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(path) -> dict:
    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("greater", [True, False])
def test_the_best_evaluation_is_checkpointed_kept_and_becomes_final(make_trainer, tmp_path, greater):
    t = make_trainer(*BEST, "steps=4", f"checkpoint.greater_is_better={str(greater).lower()}", "checkpoint.load_best_at_end=true")
    summary = t.train()
    scores = _scores(t.output_dir)
    best_value = max(scores) if greater else min(scores)
    best_step = scores.index(best_value) + 1  # the first step that reached it: a tie keeps the earlier one
    assert (summary["best_metric"], summary["best_value"], summary["best_step"]) == ("eval/reward", best_value, best_step)
    assert len(set(scores)) > 1, scores  # the evaluations differ: there is a best to pick
    kept = sorted(p.name for p in (t.output_dir / "checkpoints").glob("step-*"))
    assert kept == sorted({f"step-{best_step:07d}", "step-0000004"})  # keep=1: the newest, and the best
    final, best = _weights(t.output_dir / "final"), _weights(t.output_dir / "checkpoints" / f"step-{best_step:07d}")
    assert all(torch.equal(final[k], best[k]) for k in best)
    if best_step != 4:  # the last step's weights stay in the newest checkpoint, where --resume continues
        last = _weights(t.output_dir / "checkpoints" / "step-0000004")
        assert any(not torch.equal(final[k], last[k]) for k in last)


def test_without_load_best_final_is_the_last_step(make_trainer):
    t = make_trainer(*BEST, "steps=3", "checkpoint.greater_is_better=false")
    t.train()
    final, last = _weights(t.output_dir / "final"), _weights(t.output_dir / "checkpoints" / "step-0000003")
    assert all(torch.equal(final[k], last[k]) for k in last)


def test_a_resumed_run_compares_with_the_best_before_it(make_trainer, tmp_path):
    common = (*BEST, "checkpoint.greater_is_better=false")  # the lowest: early in the run, before the resume
    straight = make_trainer(*common, "steps=4", run="straight").train()
    make_trainer(*common, "steps=2", run="resumed").train()
    resumed = make_trainer(*common, "steps=4", "resume=auto", run="resumed").train()
    assert (resumed["best_value"], resumed["best_step"]) == (straight["best_value"], straight["best_step"])


def test_a_metric_the_evaluation_does_not_log_stops_the_run_naming_those_it_does(make_trainer):
    t = make_trainer(*BEST, "steps=2", "eval.reward=all", "checkpoint.best_metric=eval/rewards/nosuch/mean")
    with pytest.raises(
        TrainingError, match=r"best_metric=eval/rewards/nosuch/mean is not among this run's held-out metrics: eval/reward, "
    ):
        t.train()


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["checkpoint.best_metric=eval/pass@4"], "is logged only for K = 1, 2, 4, ... up to eval.samples > 1 (eval.samples=1)"),
        (["checkpoint.best_metric=eval/pass@3", "eval.samples=4"], "is logged only for K = 1, 2, 4, ... up to eval.samples > 1"),
        (["checkpoint.best_metric=eval/pass@0", "eval.samples=4"], "is logged only for K = 1, 2, 4, ... up to eval.samples > 1"),
        (["checkpoint.best_metric=eval/avg@8", "eval.samples=4"], "is logged only at N = eval.samples > 1 (eval.samples=4)"),
        (["checkpoint.best_metric=eval/maj@k", "eval.samples=4"], "is logged only as pass@K, avg@N or maj@N with numbers"),
        (["checkpoint.best_metric=eval/reward_std"], "is logged only with eval.reward=all"),
        (["checkpoint.best_metric=eval/rewards/correct/mean"], "is logged only with eval.reward=all"),
    ],
)
def test_a_metric_this_evaluation_cannot_log_is_refused_before_the_run(overrides, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        check_config(load_config(None, ["eval.every=1", *overrides]))
    check_config(load_config(None, ["eval.every=1", "eval.samples=4", "checkpoint.best_metric=eval/pass@4"]))


def test_settings_are_checked_and_unused_ones_noted():
    with pytest.raises(ConfigError) as e:
        check_config(load_config(None, ["checkpoint.best_metric=eval_reward", "checkpoint.load_best_at_end=true"]))
    text = str(e.value)
    assert (
        "`checkpoint.best_metric` names a held-out metric, e.g. eval/reward or eval/pass@4, got 'eval_reward'; did you mean `eval/reward`?"
        in text
    )
    assert "`checkpoint.best_metric`=eval_reward needs evaluations during training: set eval.every > 0" in text
    with pytest.raises(ConfigError, match=r"`checkpoint.load_best_at_end` needs checkpoint.best_metric"):
        check_config(load_config(None, ["checkpoint.load_best_at_end=true"]))
    warnings = check_config(load_config(None, ["checkpoint.greater_is_better=false"]))
    assert "checkpoint.greater_is_better=False has no effect: checkpoint.best_metric is not set" in warnings
