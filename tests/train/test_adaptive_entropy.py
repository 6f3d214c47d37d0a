"""algo.adaptive_entropy in a real run: the coefficient logged at each step is TRL's rule applied to the entropy
measured over that step's trained tokens, the bonus acts from the step after the first measurement, and a resume
mid-run continues the controller bit for bit."""

from __future__ import annotations

import json

import pytest

import torch
from safetensors.torch import load_file

ADAPTIVE = [
    "model.path=tiny",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=8",
    "eval_before_after=false",
    "optim.lr=1e-3",
    "log_completions_every=0",
    "algo.adaptive_entropy=true",
    "algo.entropy_coef=0.01",
    "algo.entropy_target=5.0",  # above the tiny model's entropy: the coefficient climbs, the bonus acts
    "algo.entropy_coef_delta=0.02",
    "algo.entropy_coef_max=0.05",
]


def _metrics(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_logged_coefficient_follows_trls_rule_on_the_measured_entropy(make_trainer, tmp_path, capsys):
    make_trainer(*ADAPTIVE, "steps=4", run="a").train()
    assert "ent.coef 0.0300" in capsys.readouterr().out  # the console's step line
    rows = _metrics(tmp_path / "a")
    coef, expected = 0.01, []
    for r in rows:  # one optimizer step per step: TRL's update once per step
        h = r["entropy/controlled"]
        coef = min(coef + 0.02, 0.05) if h <= 5.0 else max(coef - 0.02, 0.0)
        expected.append(coef)
    assert [r["entropy_coef"] for r in rows] == expected == [0.03, 0.05, 0.05, 0.05]
    # the entropy steered is the mean over the trained tokens, as `entropy` logs it for the same step
    assert all(abs(r["entropy/controlled"] - r["entropy"]) < 1e-5 for r in rows)


def test_the_bonus_changes_the_update_only_from_the_second_step(make_trainer, tmp_path):
    make_trainer(*ADAPTIVE, "steps=2", run="on").train()
    off = [a for a in ADAPTIVE if not a.startswith("algo.")]
    make_trainer(*off, "steps=2", run="off").train()
    on, plain = _metrics(tmp_path / "on"), _metrics(tmp_path / "off")
    assert on[0]["loss"] == plain[0]["loss"] and on[0]["grad_norm"] == plain[0]["grad_norm"]  # nothing measured yet: 0 applied
    assert on[1]["loss"] != plain[1]["loss"]  # 0.03 x the entropy now


def test_resume_continues_the_controller_bit_for_bit(make_trainer, tmp_path):
    make_trainer(*ADAPTIVE, "steps=4", run="straight").train()
    first = make_trainer(*ADAPTIVE, "steps=4", run="resumed")
    for _ in range(2):
        first.train_step()
    first.save_checkpoint()
    del first
    again = make_trainer(*ADAPTIVE, "steps=4", "resume=auto", run="resumed")
    assert again.updater.entropy_control.state == (0.05, again.updater.entropy_control.state.last_entropy, 5.0, ())
    again.train()
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    assert strip(_metrics(tmp_path / "straight"))[2:] == strip(_metrics(tmp_path / "resumed"))
    w1, w2 = (
        load_file(str(tmp_path / "straight" / "final" / "model.safetensors")),
        load_file(str(tmp_path / "resumed" / "final" / "model.safetensors")),
    )
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_the_report_plots_the_coefficient(make_trainer, tmp_path):
    from rlvr.observe.report import make_report

    make_trainer(*ADAPTIVE, "steps=2", run="r").train()
    html = make_report([str(tmp_path / "r")], str(tmp_path / "report")).read_text()
    assert "the coefficient algo.adaptive_entropy moved" in html


AUTO = [a for a in ADAPTIVE if not a.startswith("algo.entropy_target")]  # null: half the first 5 steps' entropy


def test_the_automatic_target_is_half_the_first_five_steps_and_resumes_mid_measurement(make_trainer, tmp_path):
    make_trainer(*AUTO, "steps=7", run="straight").train()
    rows = _metrics(tmp_path / "straight")
    target = 0.5 * sum(r["entropy/controlled"] for r in rows[:5]) / 5
    assert all("entropy/target" not in r for r in rows[:4]) and [r["entropy_coef"] for r in rows[:4]] == [0.01] * 4
    assert rows[4]["entropy/target"] == rows[6]["entropy/target"] == pytest.approx(target, rel=1e-12)
    coef = 0.01  # TRL's rule from step 5 on, against that target
    for r in rows[4:]:
        coef = min(coef + 0.02, 0.05) if r["entropy/controlled"] <= target else max(coef - 0.02, 0.0)
        assert r["entropy_coef"] == pytest.approx(coef, abs=1e-15)
    first = make_trainer(*AUTO, "steps=7", run="resumed")
    for _ in range(3):  # a checkpoint in the middle of the measurement
        first.train_step()
    first.save_checkpoint()
    del first
    again = make_trainer(*AUTO, "steps=7", "resume=auto", run="resumed")
    assert again.updater.entropy_control.state.target is None and len(again.updater.entropy_control.state.measured) == 3
    again.train()
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    assert strip(rows)[3:] == strip(_metrics(tmp_path / "resumed"))


def test_rows_with_advantage_0_skip_while_the_bonus_rests_and_the_sampler_measures_them(make_trainer, tmp_path):
    """With the coefficient applied at 0 (the automatic target still measuring), the update is the defaults' (zero-
    advantage rows skipped, the same loss and gradient), and the controller's entropy is still over every loss token,
    the skipped rows' from the sampler (in fp32 the sampler's and the trainer's entropies agree to 1e-5)."""
    make_trainer(*AUTO, "steps=3", run="auto").train()
    plain = [a for a in ADAPTIVE if not a.startswith("algo.")]
    make_trainer(*plain, "steps=3", "optim.skip_zero_advantage=false", run="all_rows").train()
    make_trainer(*plain, "steps=3", run="skipping").train()
    auto, all_rows, skipping = (_metrics(tmp_path / r) for r in ("auto", "all_rows", "skipping"))
    assert any(r["frac_reward_zero_std"] > 0 for r in auto)  # some rows had advantage 0: the skip acted
    for a, s in zip(auto, skipping):
        assert a["loss"] == s["loss"] and a["grad_norm"] == s["grad_norm"]  # the defaults' update, bit for bit
        assert a["entropy/trained"] == s["entropy/trained"]  # over the same rows: the zero-advantage ones left out
        assert a["entropy/controlled"] == pytest.approx(a["entropy"], abs=1e-5)  # every sampled token, none lost
    assert any(abs(r["entropy/trained"] - r["entropy"]) > 1e-4 for r in auto)  # ... which the controller still counted
    assert [r["loss"] for r in all_rows] == pytest.approx([r["loss"] for r in skipping], abs=1e-6)


def test_with_tools_the_skipped_rows_are_measured_by_a_forward_of_their_own(make_trainer, tmp_path):
    """The multi-turn source gives no sampler entropies: the skipped rows' come from the no-grad forward that
    `entropy` already runs for them, so the resting controller still skips and still counts every loss token."""
    from pathlib import Path

    calc = Path(__file__).resolve().parents[2] / "examples" / "tools-calculator.yaml"
    small = ["rollout.prompts_per_step=4", "rollout.group_size=4", "eval.before_after=false"]
    small += ["log_completions_every=0", "model.autocast=none", "steps=3"]
    auto = ["algo.adaptive_entropy=true", "algo.entropy_target=null", "algo.entropy_coef_delta=0.02"]
    make_trainer(*small, *auto, f"output_dir={tmp_path / 'auto'}", config=calc).train()
    make_trainer(*small, f"output_dir={tmp_path / 'skipping'}", config=calc).train()
    auto_rows, skipping = _metrics(tmp_path / "auto"), _metrics(tmp_path / "skipping")
    assert any(0 < r["frac_reward_zero_std"] < 1 for r in auto_rows)  # some rows skipped, some trained
    for a, s in zip(auto_rows, skipping):
        assert a["loss"] == s["loss"] and a["grad_norm"] == s["grad_norm"] and a.get("entropy/trained") == s.get("entropy/trained")
        assert a["entropy/controlled"] == pytest.approx(a["entropy"], abs=1e-6)  # the loss tokens are the sampled ones here
