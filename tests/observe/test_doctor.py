"""Each doctor rule fires on a synthetic metrics file made to show its problem, names the metric,
the evidence (steps) and the setting to change, and stays silent on a healthy real run."""

import json
import math
from pathlib import Path

import pytest
from _runs import healthy_run, write_metrics

from rlvr.observe.doctor import RULES, Context, diagnose, diagnose_run
from rlvr.observe.run_files import read_config, read_metrics
from rlvr.observe.sinks import jsonable


def synthetic(n=40, **curves):
    """A healthy-looking run of n steps; `curves` replace a metric with fn(step) -> value."""
    rows = []
    for s in range(1, n + 1):
        m = {
            "step": s,
            "reward": 0.2 + 0.5 * s / n,
            "reward_std": 0.3,
            "rewards/correct/mean": 0.2 + 0.5 * s / n,
            "rewards/correct/std": 0.4,
            "frac_reward_zero_std": 0.2 + 0.05 * (s % 3),
            "completions/mean_length": 20.0 + (s % 4),
            "completions/max_length": 40.0,
            "completions/clipped_ratio": 0.0,
            "clip_ratio/region_mean": 0.01,
            "clip_ratio/low_mean": 0.005,
            "clip_ratio/high_mean": 0.005,
            "entropy": 1.0 - 0.3 * s / n,
            "loss": 0.01 * ((-1) ** s),
            "grad_norm": 0.5 + 0.1 * (s % 5),
            "learning_rate": 1e-5,
        }
        for key, fn in curves.items():
            v = fn(s)
            if v is None:
                m.pop(key, None)
            else:
                m[key] = v
        rows.append({k: jsonable(v) for k, v in m.items()})
    return rows


CFG = {
    "optim": {"lr": 1e-5, "warmup_steps": 0, "max_grad_norm": 1.0},
    "algo": {"loss_type": "grpo", "beta": 0.04, "dynamic_sampling": False, "num_iterations": 2, "epsilon_high": None},
    "rollout": {"temperature": 1.0, "group_size": 8, "prompts_per_step": 8, "max_new_tokens": 64},
    "model": {"dtype": "float16"},
}

# rule -> (metric curves that show the problem, metric named, a setting the fix must mention, steps in the evidence)
SICK = {
    "prompts_too_hard": (
        {"frac_reward_zero_std": lambda s: 1.0, "reward": lambda s: 0.0, "rewards/correct/mean": lambda s: 0.0},
        "frac_reward_zero_std",
        "algo.dynamic_sampling=true",
        [31, 40],
    ),
    "prompts_too_easy": (
        {"frac_reward_zero_std": lambda s: 0.3 if s < 20 else 0.9, "reward": lambda s: 0.95},
        "frac_reward_zero_std",
        "algo.dynamic_sampling=true",
        [31, 40],
    ),
    "prompts_split": (
        {
            "frac_reward_zero_std": lambda s: 0.67,
            "frac_reward_zero_std/top": lambda s: 0.35,
            "frac_reward_zero_std/bottom": lambda s: 0.32,
            "reward": lambda s: 0.5,
        },
        "frac_reward_zero_std",
        "algo.dynamic_sampling=true",
        [31, 40],
    ),
    "reward_failing": (
        {"rewards/correct/errors": lambda s: 64 if s > 20 else 0},
        "rewards/correct/error_rate",
        "fix reward 'correct'",
        [31, 40],
    ),
    "reward_collapse": (
        {"rewards/correct/mean": lambda s: 0.6 if s < 20 else 0.05, "reward": lambda s: 0.6 if s < 20 else 0.05},
        "rewards/correct/mean",
        "optim.lr (now 1e-05)",
        [1, 40],
    ),
    "truncation": (
        {
            "completions/clipped_ratio": lambda s: 0.95,
            "frac_reward_zero_std": lambda s: 0.9,
            "reward": lambda s: 0.02,
            "completions/clipped_reward_mean": lambda s: 0.0,
            "completions/terminated_reward_mean": lambda s: 0.4,
        },
        "completions/clipped_ratio",
        "rollout.max_new_tokens (now 64)",
        [31, 40],
    ),
    "clip_high": (
        {"clip_ratio/region_mean": lambda s: 0.02 if s < 25 else 0.35},
        "clip_ratio/region_mean",
        "optim.lr (now 1e-05)",
        [31, 40],
    ),
    "entropy_collapse": ({"entropy": lambda s: 2.0 * 0.8**s}, "entropy", "algo.epsilon_high", [1, 40]),
    "kl_runaway": ({"kl": lambda s: 0.001 * 1.25**s}, "kl", "algo.beta (now 0.04)", [40]),
    "length_bias": (
        {"completions/mean_length": lambda s: 20.0 + 2.0 * s, "rewards/correct/mean": lambda s: 0.3, "reward": lambda s: 0.3},
        "completions/mean_length",
        "algo.loss_type=dr_grpo",
        [1, 40],
    ),
    "reward_hacking": (
        {"rewards/correct/mean": lambda s: 0.3, "rewards/format/mean": lambda s: 0.1 + 0.02 * s, "rewards/format/std": lambda s: 0.2},
        "rewards/format/mean",
        "rewards.1.weight",
        [1, 40],
    ),
    "non_finite": (
        {"loss": lambda s: math.nan if s in (12, 13) else 0.01, "grad_norm": lambda s: math.inf if s == 13 else 0.5},
        "grad_norm",
        "model.dtype=bfloat16",
        [12, 13],
    ),
    "grad_spike": ({"grad_norm": lambda s: 80.0 if s == 25 else 0.5 + 0.1 * (s % 5)}, "grad_norm", "optim.warmup_steps", [25]),
    # generation apart: the trainer waits for rollouts made ahead, or the generators wait for weights
    "generation_starved": (
        {"time/step": lambda s: 2.0, "time/waiting_for_rollouts": lambda s: 0.1 if s < 25 else 1.2},
        "time/waiting_for_rollouts",
        "rollout.servers",
        [31, 40],
    ),
    "generators_idle": (
        {"time/step": lambda s: 2.0, "time/generator_waiting_for_weights": lambda s: 1.5},
        "time/generator_waiting_for_weights",
        "rollout.max_staleness",
        [31, 40],
    ),
}


def test_every_rule_has_a_sick_case():
    assert set(SICK) == set(RULES)


def test_synthetic_baseline_is_healthy():
    assert diagnose(synthetic(), Context(config=CFG)) == []


@pytest.mark.parametrize("name", sorted(SICK))
def test_rule_fires_on_its_synthetic_metrics_file(name, tmp_path):
    curves, metric, setting, steps = SICK[name]
    run = write_metrics(tmp_path / name, synthetic(**curves))
    (run / "config.yaml").write_text(json.dumps(CFG))  # JSON is YAML
    history = read_metrics(run)
    f = RULES[name](history, Context(config=read_config(run)))
    assert f is not None, f"{name} did not fire"
    assert f.rule == name and f.metric == metric
    assert setting in f.fix, f.fix
    for s in steps:
        assert s in f.steps, (s, f.steps)
    assert f.message and f"step {steps[-1]}" in f.evidence, f.evidence
    # only this rule, or rules that are the same problem seen from another side
    related = {"length_bias": {"reward_hacking"}}.get(name, set())
    others = {x.rule for x in diagnose(history, Context(config=CFG))} - {name} - related
    assert not others, f"{name}'s case also fired {others}"


def test_rule_needs_enough_steps():
    """Three steps are not a trend: the trend rules stay silent (identical groups in every step so far, NaN and
    failing rewards may not)."""
    assert RULES["clip_high"](synthetic(n=3, **{"clip_ratio/region_mean": lambda s: 0.5}), Context()) is None
    assert RULES["clip_high"](synthetic(n=8, **{"clip_ratio/region_mean": lambda s: 0.5}), Context()) is not None
    assert RULES["length_bias"](synthetic(n=6, **SICK["length_bias"][0]), Context()) is None


def test_reward_hacking_uses_the_named_correctness_reward():
    rows = synthetic(**{"rewards/correct/mean": lambda s: 0.3, "rewards/format/mean": lambda s: 0.1 + 0.02 * s})
    # told that `format` is the correctness reward, nothing else rises: no hacking
    assert RULES["reward_hacking"](rows, Context(correctness="format")) is None
    assert RULES["reward_hacking"](rows, Context()) is not None


def test_live_doctor_reports_a_problem_once_while_it_lasts():
    from rlvr.observe.doctor import LiveDoctor

    rows = synthetic(**SICK["grad_spike"][0])
    d = LiveDoctor(Context())
    assert [f.rule for f in d.check(rows[:30])] == ["grad_spike"]
    assert d.check(rows[:35]) == []  # still there: not repeated
    assert d.check(synthetic()) == []  # cleared
    assert [f.rule for f in d.check(rows)] == ["grad_spike"]  # back again: reported again


# ------------------------------------------------------------------------------- the healthy run


@pytest.fixture(scope="module")
def healthy(tmp_path_factory, tiny_model_dir, rlvr_cli):
    return healthy_run(tmp_path_factory, tiny_model_dir, rlvr_cli)


@pytest.mark.parametrize("name", sorted(RULES))
def test_rule_is_silent_on_a_healthy_real_run(name, healthy):
    run, _ = healthy
    history = read_metrics(run)
    assert len(history) == 30
    assert RULES[name](history, Context(config=read_config(run))) is None


def test_doctor_cli(healthy, tmp_path, rlvr_cli):
    run, stdout = healthy
    ok = rlvr_cli("doctor", run, timeout=60)
    assert ok.returncode == 0 and "no problems found" in ok.stdout, ok.stdout + ok.stderr
    assert "[warning] doctor" not in stdout  # nor during training

    sick = write_metrics(tmp_path / "sick", synthetic(**SICK["clip_high"][0]))
    bad = rlvr_cli("doctor", sick, timeout=60)
    assert bad.returncode == 1
    assert "clip_high" in bad.stdout and "evidence: step 31" in bad.stdout and "fix: lower optim.lr" in bad.stdout
    js = rlvr_cli("doctor", "--json", sick, timeout=60)
    assert json.loads(js.stdout)["findings"][0]["rule"] == "clip_high"
    missing = rlvr_cli("doctor", tmp_path / "nope", timeout=60)
    assert missing.returncode == 2 and "metrics.jsonl" in missing.stderr


def test_diagnose_run_reads_config(tmp_path):
    run = write_metrics(tmp_path / "r", synthetic(**SICK["kl_runaway"][0]))
    (run / "config.yaml").write_text("algo:\n  beta: 0.001\noptim:\n  lr: 0.003\n")
    (f,) = diagnose_run(run)
    assert "now 0.001" in f.fix and "now 0.003" in f.fix


def test_doctor_is_silent_on_the_bundled_demo(tmp_path, rlvr_cli):
    """The demo as shipped (bundled tiny model on arithmetic), shortened to 30 steps, is healthy."""
    from _runs import train_cli

    from rlvr.models import resolve_model_path

    assert (Path(resolve_model_path("tiny")) / "config.json").is_file()
    proc = train_cli(rlvr_cli, tmp_path / "demo", "steps=30", "data.eval_size=100", "report_to=[]")
    history = read_metrics(tmp_path / "demo")
    assert len(history) == 30
    findings = diagnose(history, Context(config=read_config(tmp_path / "demo")))
    assert findings == []
    assert "[warning]" not in proc.stdout
