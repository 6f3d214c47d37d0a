"""The doctor names the cause of identical rewards within groups, on a labelled set of run histories
(tests/_doctor_cases.py: synthetic problems and their look-alikes, plus real short runs)."""

import pytest
import torch
from _doctor_cases import REAL, all_cases, real_cases, synthetic_cases

from rlvr.observe.doctor import CAUSES, Context, LiveDoctor, diagnose
from rlvr.training.step_metrics import distinct_share, identical_groups

CASES = {c.name: c for c in all_cases()}
assert len(CASES) == len(all_cases()), "case names must be unique"


def _verdict(case) -> dict:
    return {f.rule: f for f in diagnose(case.history, Context(config=case.config))}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_labelled_history_gets_its_diagnosis(name):
    case = CASES[name]
    found = _verdict(case)
    assert case.expected <= set(found), f"{name}: missed {case.expected - set(found)}; found {sorted(found)}"
    assert set(found) <= case.expected | case.tolerated, f"{name}: wrongly named {set(found) - case.expected - case.tolerated}"
    for f in found.values():
        assert "step " in f.evidence and f.fix, (name, str(f))


def test_the_labelled_set_covers_every_cause_and_real_runs():
    named = set().union(*(c.expected for c in CASES.values()))
    assert set(CAUSES) | {"kl_runaway"} <= named
    assert len(real_cases()) >= 4 and len(synthetic_cases()) >= 15
    assert any(not c.expected for c in real_cases()), "a healthy real run is in the set"


def test_smollm2_collapse_is_entropy_collapse_not_easy_prompts():
    """A real SmolLM2 run: the doctor said "prompts look too easy"; the policy had stopped exploring."""
    (f,) = _verdict(CASES["smollm2_collapse"]).values()
    assert f.rule == "entropy_collapse" and f.metric == "entropy"
    assert "token entropy 0.533 -> 0.03 nats" in f.message  # means of the first and last 3 steps
    assert "84% of groups had identical rewards (steps 51-60)" in f.message  # 75-100 % a step
    assert "36% of groups got the step's lowest reward" in f.message  # 43 % of the identical groups wrong
    assert "easy" not in f.message and "filter" not in f.fix
    adaptive = "algo.adaptive_entropy=true: its automatic target is half the entropy of the first 5 steps, here about 0.27"
    clip_cov = "Clip-Cov (algo.clip_cov_ratio=0.02"
    for setting in (adaptive, clip_cov, "rollout.temperature (now 0.7)", "algo.epsilon_high=0.28", "optim.lr (now 1e-05)"):
        assert setting in f.fix, (setting, f.fix)
    # the same run as the old entropy metric showed it: the distinct-completion share tells
    (g,) = _verdict(CASES["smollm2_collapse_hidden_entropy"]).values()
    assert g.rule == "entropy_collapse" and g.metric == "distinct_completions" and "88% -> 20%" in g.message  # first and last 3 steps


def test_a_collapse_under_the_adaptive_controller_asks_it_to_act_sooner():
    case = CASES["smollm2_collapse"]
    algo = {**case.config["algo"], "adaptive_entropy": True, "entropy_coef_delta": 0.005, "entropy_target": None}
    history = [h | {"entropy_coef": min(0.005 * i, 0.1)} for i, h in enumerate(case.history)]
    (f,) = diagnose(history, Context(config={**case.config, "algo": algo}))
    assert f.rule == "entropy_collapse"
    assert "the adaptive controller was on, its coefficient reached 0.1" in f.fix
    assert "algo.entropy_coef_delta, e.g. 0.05 (now 0.005)" in f.fix and "algo.entropy_target=0.27" in f.fix and "(now None)" in f.fix
    assert "algo.adaptive_entropy=true" not in f.fix


def test_a_collapse_under_clip_cov_asks_for_a_larger_share():
    case = CASES["smollm2_collapse"]
    (f,) = diagnose(case.history, Context(config={**case.config, "algo": {**case.config["algo"], "clip_cov_ratio": 0.02}}))
    assert f.rule == "entropy_collapse"
    assert "Clip-Cov was on: detach more of the tokens that drive the collapse (algo.clip_cov_ratio, e.g. 0.04 (now 0.02))" in f.fix
    assert "algo.clip_cov_ratio=0.02" not in f.fix


def test_live_doctor_never_blames_the_prompts_during_the_collapse():
    """Checked as training does (after step 3, then every 10 steps): collapse is reported, prompts never."""
    history = CASES["smollm2_collapse"].history
    doctor = LiveDoctor(Context(config=CASES["smollm2_collapse"].config))
    reported = {}
    for step in [3, *range(10, len(history) + 1, 10)]:
        for f in doctor.check(history[:step]):
            reported.setdefault(f.rule, step)
    assert reported == {"entropy_collapse": 20}


def test_failing_reward_is_named_with_its_share_before_the_prompts():
    for name, share in [
        ("failing_reward", "100% of samples"),
        ("failing_reward_error_rate", "100% of samples"),
        ("failing_format_beside_correctness", "41% of samples"),
    ]:
        found = _verdict(CASES[name])
        f = found["reward_failing"]
        assert f.message.startswith(f"reward {'format' if 'format' in name else 'correct'!r} failed on {share}"), f.message
        assert "prompts_too_hard" not in found
    live = LiveDoctor(Context(config=CASES["failing_reward"].config)).check(CASES["failing_reward"].history[:3])
    assert [f.rule for f in live] == ["reward_failing"] and live[0].severity == "error"


def test_when_two_causes_fit_the_doctor_says_so():
    found = _verdict(CASES["collapse_with_truncation"])
    assert "another cause fits too: truncation" in found["entropy_collapse"].message
    assert "another cause fits too: entropy_collapse" in found["truncation"].message
    (solved,) = _verdict(CASES["mastered_and_collapsed"]).values()
    assert "two causes fit" in solved.message and "prompts_too_easy" in solved.message
    all_cut = _verdict(CASES["truncation_all_cut"])
    assert "may also be too hard" in all_cut["truncation"].message
    assert "another cause fits too: truncation" in all_cut["prompts_too_hard"].message
    assert "ended scored 0.4 on average, cut ones 0" in _verdict(CASES["truncation"])["truncation"].message
    # too easy and too hard together are one bimodal prompt set, not rival causes
    mixed = _verdict(CASES["mixed_difficulty_exploring"])
    assert all("another cause" not in f.message for f in mixed.values())


def test_group_metrics_of_a_batch():
    grouped = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0], [0.5, 0.5, 0.5]], dtype=torch.float64)
    m = identical_groups(grouped)
    assert m == {"frac_reward_zero_std": 0.75, "frac_reward_zero_std/top": 0.25, "frac_reward_zero_std/bottom": 0.25}
    every_one = identical_groups(torch.zeros(2, 3, dtype=torch.float64))  # one value in the whole step: top is bottom
    assert every_one == {"frac_reward_zero_std": 1.0, "frac_reward_zero_std/top": 1.0, "frac_reward_zero_std/bottom": 1.0}
    assert distinct_share(["a", "a", "a", "a", "b", "c"], 3) == pytest.approx(4 / 6, abs=1e-12)
    assert distinct_share(["x"] * 8, 4) == 0.25


def test_rlvr_doctor_names_the_failing_reward_of_a_real_run(rlvr_cli):
    assert "real/failing_reward" in CASES
    proc = rlvr_cli("doctor", REAL / "failing_reward", timeout=60)
    assert proc.returncode == 1
    assert "reward_failing" in proc.stdout and "reward 'broken' failed on 100% of samples" in proc.stdout, proc.stdout
    assert "prompts_too_hard" not in proc.stdout
