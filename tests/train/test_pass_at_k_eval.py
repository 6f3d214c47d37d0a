"""Sampled held-out evaluation (eval.samples / rlvr eval --samples): pass@k for k = 1, 2, 4, ... with intervals,
maj@n for verifiers that compare answers, avg@n; in the training metrics, the console and summary.json."""

from __future__ import annotations

import json
import re

import pytest

from rlvr.algo.pass_at_k import pass_at_k
from rlvr.models import resolve_model_path
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.rewards import RewardFn, RewardRunner, load_reward_fn
from rlvr.rollout import SamplingParams, make_engine
from rlvr.rollout.sources.single_turn import SingleTurnSource
from rlvr.tasks import get_task
from rlvr.training.collect import score
from rlvr.training.evaluation import evaluate

LINE = re.compile(r"^\s+(pass@\d+|maj@\d+|avg@\d+)\s+([\d.]+) \[([\d.]+), ([\d.]+)\]")


def test_rlvr_eval_samples_prints_pass_at_k_with_intervals(rlvr_cli):
    proc = rlvr_cli("eval", "tiny", "--samples", "8", "--n", "30", "--temperature", "1.0", check=True)
    numbers = {m[1]: (float(m[2]), float(m[3]), float(m[4])) for m in map(LINE.match, proc.stdout.splitlines()) if m}
    assert list(numbers) == ["pass@1", "pass@2", "pass@4", "pass@8", "maj@8", "avg@8"], proc.stdout
    passes = [numbers[f"pass@{k}"][0] for k in (1, 2, 4, 8)]
    assert passes == sorted(passes) and 0 < passes[0] < passes[-1]  # the tiny model solves some, more with more tries
    assert numbers["avg@8"] == numbers["pass@1"]  # pass@1's estimate is the mean correctness
    assert all(low <= mean <= high for mean, low, high in numbers.values())
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("arithmetic held-out accuracy (30 problems, 8 samples each, temperature 1)") and last.endswith(
        f"avg@8 {passes[0]:.3f}"
    )


def test_evaluate_matches_pass_at_k_of_its_own_episodes():
    """pass@k of the outcome is the estimator over the rewards of exactly the episodes sampled (seeded by row)."""
    tok = load_tokenizer(resolve_model_path("tiny"))[0]
    model = load_model(resolve_model_path("tiny")).eval()
    task = get_task("arithmetic", seed=0, eval_size=12)
    rows = task.eval_rows()
    reward = RewardRunner([RewardFn("correct", load_reward_fn(task.reward), 1.0)])
    source = SingleTurnSource(make_engine("hf", model, tok), tok, SamplingParams(n=4, temperature=1.0, max_new_tokens=8))
    outcome = evaluate(source, rows, reward, batch_size=5)  # batches of 5 rows: seeds are the rows' own, whatever the batch
    per = score(reward, rows, source.rollout(rows, list(range(len(rows)))))[:, 0].view(len(rows), 4).double()
    for k in (1, 2, 4):
        assert outcome.pass_at[k].mean == pytest.approx(float(pass_at_k(per, k).mean()), abs=1e-12)
    assert outcome.score == pytest.approx(float(per.mean()), abs=1e-12) and outcome.samples == 4 and 0 < outcome.score < 1


def test_training_logs_pass_at_k(make_trainer):
    t = make_trainer(
        "steps=2", "eval.samples=4", "eval.every=1", "eval.before_after=true", "data.eval_size=16", "rollout.max_new_tokens=6", run="passk"
    )
    t.train()
    rows = [json.loads(x) for x in (t.output_dir / "metrics.jsonl").read_text().splitlines()]
    first = rows[0]
    assert {"eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/maj@4", "eval/avg@4"} <= set(first)
    assert first["eval/pass@1"] == pytest.approx(first["eval/avg@4"]) == pytest.approx(first["eval/reward"])
    assert first["eval/pass@1"] <= first["eval/pass@2"] <= first["eval/pass@4"]
    summary = json.loads((t.output_dir / "summary.json").read_text())
    assert summary["eval_after"] == pytest.approx(summary["eval_after_avg@4"]) and "eval_after_pass@4" in summary
    from rlvr.observe.report import make_report

    page = make_report([t.output_dir]).read_text()  # the report plots them
    assert (t.output_dir / "report" / "pass_at_k.png").stat().st_size > 10_000 and "Held-out pass@k" in page


def test_sampled_evaluation_samples_through_the_trainings_filters(make_trainer):
    """eval.samples > 1 samples through rollout.top_k (and top_p, min_p, repetition_penalty), as TRL's evaluation:
    with top_k=1 every sample is the greedy completion, so pass@4 is pass@1 is the greedy accuracy (at temperature 1
    without the filter the tiny model's samples differ: pass@4 > pass@1, test_rlvr_eval_samples_prints_...)."""
    common = (f"model.path={resolve_model_path('tiny')}", "data.eval_size=24", "eval.every=1")  # the bundled model solves some
    greedy = make_trainer(*common, run="greedy").evaluate()
    t = make_trainer(*common, "eval.samples=4", "eval.temperature=1.0", "rollout.top_k=1", run="top_k")
    assert t.evaluate() == pytest.approx(greedy, abs=1e-12) and 0 < greedy < 1
    assert t.eval_metrics["eval/pass@1"] == pytest.approx(t.eval_metrics["eval/pass@4"], abs=1e-12)
    free = make_trainer(*common, "eval.samples=4", "eval.temperature=1.0", run="free")
    free.evaluate()
    assert free.eval_metrics["eval/pass@4"] > free.eval_metrics["eval/pass@1"]  # the filter is what made them equal


@pytest.mark.parametrize(
    "args,message",
    [
        (["--samples", "0"], "`eval.samples` must be >= 1 (1: greedy), got 0"),
        (["--samples", "4", "--temperature", "0"], "`eval.temperature` must be positive to sample eval.samples=4 episodes per row"),
    ],
)
def test_bad_sampling_settings_name_the_field(rlvr_cli, tiny_model_dir, args, message):
    proc = rlvr_cli("eval", tiny_model_dir, "--n", "4", *args)
    assert proc.returncode != 0 and message in proc.stderr


def test_a_reward_that_is_not_0_1_gets_no_pass_at_k(rlvr_cli, tiny_model_dir, tmp_path):
    data = tmp_path / "held.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(6)))
    proc = rlvr_cli("eval", tiny_model_dir, "--data", data, "--reward", "length", "--samples", "2", check=True)
    assert not re.search(r"^\s+pass@", proc.stdout, re.M)
    assert "[note] no pass@k: the reward 'length' is not 0/1 on every episode" in proc.stdout
    assert re.search(r"avg@2 -?[\d.]+$", proc.stdout.strip())


def _odd_only_length(completions, answer, **kwargs):  # None for even answers: not applicable there
    return [None if int(a) % 2 == 0 else -len(c) / 10 for c, a in zip(completions, answer)]


def _grader_down(completions, **kwargs):
    raise ValueError("grader down")


def test_weighted_evaluation_is_trls_eval_reward():
    """eval.reward=all: the mean over episodes of the functions' weighted sum (None and failed calls left out of the
    sum, an episode nothing scored out of the mean), TRL's eval_reward, with each function's mean and std."""
    import torch

    from rlvr.training.evaluation import evaluate_weighted

    tok = load_tokenizer(resolve_model_path("tiny"))[0]
    model = load_model(resolve_model_path("tiny")).eval()
    task = get_task("arithmetic", seed=0, eval_size=10)
    rows = task.eval_rows()
    correct = RewardFn("correct", load_reward_fn(task.reward), 1.0)
    reward = RewardRunner([correct, RewardFn("odd_length", _odd_only_length, 0.5)])
    source = SingleTurnSource(make_engine("hf", model, tok), tok, SamplingParams(n=2, temperature=1.0, max_new_tokens=6))
    outcome = evaluate_weighted(source, rows, reward, batch_size=4)
    r = score(reward, rows, source.rollout(rows, list(range(len(rows))))).double()  # [20, 2]
    assert r[:, 1].isnan().sum() == 2 * sum(int(x["answer"]) % 2 == 0 for x in rows) > 0
    total = r[:, 0] + 0.5 * r[:, 1].nan_to_num(0.0)
    assert outcome.score == pytest.approx(float(total.mean()), abs=1e-12)
    odd = r[:, 1][~r[:, 1].isnan()]
    m = outcome.metrics()
    assert m["eval/rewards/odd_length/mean"] == pytest.approx(float(odd.mean()), abs=1e-12)
    assert m["eval/rewards/odd_length/std"] == pytest.approx(float(odd.std()), abs=1e-12)  # Bessel, as TRL's nanstd
    assert m["eval/reward_std"] == pytest.approx(float(total.std()), abs=1e-12)
    assert m["eval/avg@2"] == pytest.approx(outcome.score, abs=1e-12) and outcome.failed == 0
    # a function failing on every call is left out of every sum; the other still scores
    failing = RewardRunner([correct, RewardFn("flaky", _grader_down, 1.0)])
    outcome = evaluate_weighted(source, rows, failing)
    assert outcome.failed == 2 * len(rows) and "grader down" in (outcome.first_error or "")
    assert outcome.score == pytest.approx(float(r[:, 0].mean()), abs=1e-12) and "left out of the sums" in outcome.failure_note()
    assert torch.isnan(torch.tensor(outcome.metrics()["eval/rewards/flaky/mean"]))


def test_training_with_eval_reward_all_logs_the_weighted_sum_and_each_function(make_trainer):
    t = make_trainer(
        "model.path=tiny",  # the bundled model: it gets some right
        "steps=1",
        "eval.reward=all",
        "eval.before_after=true",
        "data.eval_size=20",
        "rollout.max_new_tokens=6",
        "rewards=[{fn: arithmetic, weight: 1.0, name: right}, {fn: arithmetic, weight: 0.5, name: half}]",
        run="weighted",
    )
    t.train()
    summary = json.loads((t.output_dir / "summary.json").read_text())
    assert summary["eval_label"] == "mean weighted reward"
    right = summary["eval_after_rewards/right/mean"]
    assert 0 < right < 1 and summary["eval_after_rewards/half/mean"] == right
    assert summary["eval_after"] == pytest.approx(1.5 * right, abs=1e-12)
