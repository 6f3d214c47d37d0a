"""The doctor's labelled set: run histories, each with the causes a person who knew the run would
name (`expected`) and the rival causes that fit its metrics just as well (`tolerated`: the doctor
may name them too, and then says that two causes fit).

Synthetic histories are written step by step from curves, one per problem and its look-alikes
(collapse that looks like easy prompts, hard prompts with a policy that still explores, a failing
reward, a healthy run that solves more and more groups, ...). Real histories are `metrics.jsonl`
files of short real runs kept in tests/fixtures/doctor/ (the commands that made them are in its
README.md). tests/observe/test_doctor_cases.py asserts the verdict on every case; bench/doctor_eval.py
computes each rule's precision and recall over them for docs/observability.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from _paths import TESTS

REAL = TESTS / "fixtures" / "doctor"

# The settings the synthetic runs quote (config.yaml of a run as `rlvr train` writes it, abridged).
CONFIG = {
    "rollout": {"group_size": 8, "prompts_per_step": 8, "temperature": 1.0, "max_new_tokens": 64},
    "optim": {"lr": 1e-5, "warmup_steps": 0, "max_grad_norm": 1.0},
    "algo": {
        "loss_type": "grpo",
        "beta": 0.0,
        "dynamic_sampling": False,
        "epsilon_high": None,
        "num_iterations": 1,
        "mask_truncated_completions": False,
    },
    "model": {"dtype": "float32"},
}


@dataclass
class Case:
    name: str
    about: str  # what the run was, in words
    history: list[dict]
    expected: set[str]  # the causes that are really there
    tolerated: set[str] = field(default_factory=set)  # rivals that fit the metrics too
    config: dict = field(default_factory=lambda: CONFIG)
    real: bool = False


def ramp(a: float, b: float, s: int, n: int) -> float:
    """a at step 1 to b at step n, linearly."""
    return a + (b - a) * (s - 1) / max(1, n - 1)


def decay(a: float, b: float, s: int, steps: int) -> float:
    """a at step 1 falling geometrically to b at step `steps`, then staying at b."""
    return a * (b / a) ** ((min(s, steps) - 1) / (steps - 1))


def history(n: int = 40, **curves) -> list[dict]:
    """n steps of a healthy run (rising reward, a third of the groups identical, split between
    solved and failed, exploring policy); `curves` replace a metric with fn(step) -> value (None
    drops it). Keys use the names `rlvr train` logs; `/` in a metric name is written `__`."""
    rows = []
    for s in range(1, n + 1):
        zero = 0.3 + 0.05 * (s % 3)
        m = {
            "step": s,
            "reward": ramp(0.25, 0.7, s, n),
            "reward_std": 0.3,
            "rewards/correct/mean": ramp(0.25, 0.7, s, n),
            "rewards/correct/std": 0.4,
            "rewards/correct/errors": 0,
            "frac_reward_zero_std": zero,
            "frac_reward_zero_std/top": zero * ramp(0.3, 0.7, s, n),
            "frac_reward_zero_std/bottom": zero * ramp(0.7, 0.3, s, n),
            "distinct_completions": 0.9,
            "completions/mean_length": 30.0 + (s % 4),
            "completions/max_length": 64.0,
            "completions/clipped_ratio": 0.05,
            "clip_ratio/region_mean": 0.01,
            "entropy": ramp(0.9, 0.6, s, n),
            "loss": 0.01 * (-1) ** s,
            "grad_norm": 0.5 + 0.1 * (s % 5),
            "learning_rate": 1e-5,
        }
        for key, fn in curves.items():
            key = key.replace("__", "/")
            v = fn(s)
            if v is None:
                m.pop(key, None)
            else:
                m[key] = v
        rows.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in m.items()})
    return rows


def identical(zero, top_part):
    """Curves for frac_reward_zero_std (zero(s)) of which a share top_part(s) sits at the top reward."""
    return {
        "frac_reward_zero_std": zero,
        "frac_reward_zero_std__top": lambda s: zero(s) * top_part(s),
        "frac_reward_zero_std__bottom": lambda s: zero(s) * (1 - top_part(s)),
    }


# Every reward of every step equal (every group identical at one value): the top is the bottom.
ALL_ONE_VALUE = {
    "frac_reward_zero_std": lambda s: 1.0,
    "frac_reward_zero_std__top": lambda s: 1.0,
    "frac_reward_zero_std__bottom": lambda s: 1.0,
}


# 75-100 % identical groups after step 20 (mean 86 %), as in a real SmolLM2 run that collapsed.
def _smollm2_zero(s):
    return ramp(0.3, 0.75, s, 20) if s <= 20 else (0.75, 0.875, 1.0, 0.875, 0.75, 0.9)[s % 6]


_SMOLLM2 = {
    "rollout": {"group_size": 8, "prompts_per_step": 8, "temperature": 0.7, "max_new_tokens": 48},
    "optim": {"lr": 1e-5},
    "algo": {"beta": 0.0, "epsilon_high": None, "dynamic_sampling": False},
    "model": {"autocast": "none"},
}


def _smollm2(entropy, distinct) -> list[dict]:
    return history(
        60,
        **identical(_smollm2_zero, lambda s: 0.57),  # the identical groups are as often right as the batch: 0.57
        **{
            "rewards/math/mean": lambda s: 0.57,
            "rewards/answer_tag/mean": lambda s: 0.99,
            "rewards/correct/mean": lambda s: None,
            "rewards/correct/std": lambda s: None,
            "rewards/correct/errors": lambda s: None,
            "rewards/math/errors": lambda s: 0,
            "rewards/answer_tag/errors": lambda s: 0,
            "reward": lambda s: 0.57 + 0.5 * 0.99,
            "completions/clipped_ratio": lambda s: 0.3,
            "entropy": entropy,
            "distinct_completions": distinct,
        },
    )


def synthetic_cases() -> list[Case]:
    n = 40
    return [
        Case("healthy", "reward rises, a third of the groups identical, the policy explores", history(), set()),
        Case(
            "smollm2_collapse",
            "a SmolLM2 run: entropy 0.62 -> 0.03 in 20 steps, 75-100 % identical groups, "
            "math reward ~0.57 (identical groups both right and wrong)",
            _smollm2(lambda s: decay(0.62, 0.03, s, 20), lambda s: decay(0.95, 0.45, s, 20)),
            {"entropy_collapse"},
            config=_SMOLLM2,
        ),
        Case(
            "smollm2_collapse_hidden_entropy",
            "the same run as the old entropy metric showed it (trained rows only: stays high); the distinct-completion share falls to 20 %",
            _smollm2(lambda s: ramp(0.62, 0.4, s, 60), lambda s: decay(0.95, 0.2, s, 20)),
            {"entropy_collapse"},
            config=_SMOLLM2,
        ),
        Case(
            "collapse_on_wrong_answers",
            "entropy collapses while most identical groups are all wrong",
            history(
                n,
                **identical(lambda s: ramp(0.3, 0.9, s, n), lambda s: 0.15),
                reward=lambda s: 0.12,
                entropy=lambda s: decay(1.0, 0.02, s, 25),
                distinct_completions=lambda s: decay(0.95, 0.2, s, 25),
            ),
            {"entropy_collapse"},
        ),
        Case(
            "mastered_and_collapsed",
            "the model solves nearly every prompt and samples one answer: both a collapse and easy prompts fit",
            history(
                n,
                **identical(lambda s: ramp(0.3, 0.92, s, n), lambda s: ramp(0.5, 0.98, s, n)),
                reward=lambda s: ramp(0.5, 0.97, s, n),
                entropy=lambda s: decay(0.8, 0.03, s, 30),
                distinct_completions=lambda s: decay(0.9, 0.15, s, 30),
            ),
            {"entropy_collapse"},
        ),
        Case(
            "hard_prompts_exploring",
            "80 % of groups all wrong, entropy high and steady, every completion different",
            history(
                n,
                **identical(lambda s: 0.8, lambda s: 0.03),
                reward=lambda s: 0.05,
                entropy=lambda s: 1.2,
                distinct_completions=lambda s: 1.0,
            ),
            {"prompts_too_hard"},
        ),
        Case(
            "easy_prompts_exploring",
            "85 % of groups all right, entropy moderate and steady",
            history(
                n,
                **identical(lambda s: 0.85, lambda s: 0.97),
                reward=lambda s: 0.95,
                entropy=lambda s: ramp(0.5, 0.4, s, n),
                distinct_completions=lambda s: 0.6,
            ),
            {"prompts_too_easy"},
        ),
        Case(
            "mixed_difficulty_exploring",
            "half the identical groups solved, half failed, the policy explores: a bimodal prompt set",
            history(n, **identical(lambda s: 0.8, lambda s: 0.5), reward=lambda s: 0.5, entropy=lambda s: 0.9),
            {"prompts_split"},
        ),
        Case(
            "no_signal_from_start",
            "a model that never solves a prompt: every group all zero from step 1 (early: 4 steps)",
            history(
                4,
                **ALL_ONE_VALUE,
                reward=lambda s: 0.0,
                entropy=lambda s: 2.5,
                distinct_completions=lambda s: 1.0,
                **{"rewards/correct/mean": lambda s: 0.0},
            ),
            {"prompts_too_hard"},
        ),
        Case(
            "old_run_without_group_metrics",
            "a run logged before distinct_completions and frac_reward_zero_std/top existed: 90 % identical groups, reward 0.9",
            history(
                n,
                frac_reward_zero_std=lambda s: 0.9,
                reward=lambda s: 0.9,
                frac_reward_zero_std__top=lambda s: None,
                frac_reward_zero_std__bottom=lambda s: None,
                distinct_completions=lambda s: None,
            ),
            {"prompts_too_easy"},
        ),
        Case(
            "healthy_many_solved_late",
            "a run that learns: late on half the groups are solved alike, entropy eases 0.8 -> 0.3, completions still differ",
            history(
                n,
                **identical(lambda s: ramp(0.2, 0.55, s, n), lambda s: ramp(0.3, 0.95, s, n)),
                reward=lambda s: ramp(0.3, 0.85, s, n),
                entropy=lambda s: ramp(0.8, 0.3, s, n),
                distinct_completions=lambda s: ramp(0.95, 0.7, s, n),
            ),
            set(),
        ),
        Case(
            "mastered_late_exploring",
            "a run that learned the task: late on 80 % of groups solved alike, the policy still explores",
            history(
                n,
                **identical(lambda s: ramp(0.2, 0.8, s, n), lambda s: ramp(0.3, 0.97, s, n)),
                reward=lambda s: ramp(0.3, 0.92, s, n),
                entropy=lambda s: ramp(0.8, 0.35, s, n),
                distinct_completions=lambda s: ramp(0.95, 0.65, s, n),
            ),
            {"prompts_too_easy"},
        ),
        Case(
            "short_answers_from_start",
            "a short-answer task (the demo): 1.6 distinct completions of 8 and entropy 0.2 from the first step, nothing falls",
            history(n, distinct_completions=lambda s: 0.2, entropy=lambda s: 0.21 + 0.01 * (s % 3)),
            set(),
        ),
        Case(
            "failing_reward",
            "the only reward raises on every call (today's metrics: errors counted, no error_rate)",
            history(
                12,
                **ALL_ONE_VALUE,
                reward=lambda s: 0.0,
                **{
                    "rewards/correct/mean": lambda s: math.nan,
                    "rewards/correct/std": lambda s: math.nan,
                    "rewards/correct/errors": lambda s: 64,
                },
            ),
            {"reward_failing"},
        ),
        Case(
            "failing_reward_error_rate",
            "the same with rewards/<name>/error_rate logged and no config.yaml to size the batch",
            history(
                12,
                **ALL_ONE_VALUE,
                reward=lambda s: 0.0,
                **{
                    "rewards/correct/mean": lambda s: math.nan,
                    "rewards/correct/errors": lambda s: 64,
                    "rewards/correct/error_rate": lambda s: 1.0,
                },
            ),
            {"reward_failing"},
            config={},
        ),
        Case(
            "failing_format_beside_correctness",
            "a second reward fails on 40 % of samples; the correctness reward works",
            history(n, **{"rewards/format/mean": lambda s: 0.5, "rewards/format/errors": lambda s: 26}),
            {"reward_failing"},
        ),
        Case(
            "rare_reward_errors",
            "a reward fails on 1 sample in 64: not worth a finding",
            history(n, **{"rewards/correct/errors": lambda s: 1 if s % 2 else 0}),
            set(),
        ),
        Case(
            "truncation",
            "answers cut at the token limit: 95 % of completions clipped, 90 % of groups all zero, the few completions that end score 0.4",
            history(
                n,
                **identical(lambda s: 0.9, lambda s: 0.02),
                reward=lambda s: 0.02,
                entropy=lambda s: 1.0,
                **{
                    "completions/clipped_ratio": lambda s: 0.95,
                    "completions/mean_length": lambda s: 63.5,
                    "completions/clipped_reward_mean": lambda s: 0.0,
                    "completions/terminated_reward_mean": lambda s: 0.4,
                },
            ),
            {"truncation"},
        ),
        Case(
            "truncation_all_cut",
            "every completion cut at the limit and every group all zero: the cut or the prompts, nothing in the metrics tells which",
            history(
                n,
                **identical(lambda s: 0.9, lambda s: 0.0),
                reward=lambda s: 0.0,
                entropy=lambda s: 1.0,
                **{
                    "completions/clipped_ratio": lambda s: 1.0,
                    "completions/mean_length": lambda s: 64.0,
                    "completions/clipped_reward_mean": lambda s: 0.0,
                    "completions/terminated_reward_mean": lambda s: math.nan,
                },
            ),
            {"truncation"},
            {"prompts_too_hard"},
        ),
        Case(
            "hard_prompts_rambling",
            "a model that fails and rambles to the limit: 90 % cut, the completions that end fail just as often",
            history(
                n,
                **identical(lambda s: 0.9, lambda s: 0.02),
                reward=lambda s: 0.01,
                entropy=lambda s: 1.5,
                **{
                    "completions/clipped_ratio": lambda s: 0.9,
                    "completions/clipped_reward_mean": lambda s: 0.01,
                    "completions/terminated_reward_mean": lambda s: 0.02,
                },
            ),
            {"prompts_too_hard"},
        ),
        Case(
            "truncated_but_learning",
            "most completions run to the limit after the answer (the SmolLM2 bench): reward rises, groups differ",
            history(n, **{"completions/clipped_ratio": lambda s: 0.85}),
            set(),
        ),
        Case(
            "lr_too_high_unlearns",
            "the policy gets worse: correctness 0.6 -> 0.02 within 10 steps, then every group all wrong",
            history(
                n,
                **identical(lambda s: 0.3 if s < 10 else 0.95, lambda s: 0.5 if s < 10 else 0.0),
                **{"rewards/correct/mean": lambda s: 0.6 if s < 10 else max(0.02, 0.6 - 0.06 * (s - 9))},
                reward=lambda s: 0.6 if s < 10 else max(0.02, 0.6 - 0.06 * (s - 9)),
                entropy=lambda s: 0.9,
            ),
            {"reward_collapse"},
        ),
        Case(
            "noisy_flat_reward",
            "a run that does not improve but does not get worse: correctness 0.3 +- 0.12 step to step",
            history(
                n,
                **{"rewards/correct/mean": lambda s: 0.3 + 0.12 * ((s * 7) % 5 - 2) / 2},
                reward=lambda s: 0.3 + 0.12 * ((s * 7) % 5 - 2) / 2,
            ),
            set(),
        ),
        Case(
            "kl_runaway",
            "KL to the reference grows 1.25x a step",
            history(n, kl=lambda s: 0.001 * 1.25**s),
            {"kl_runaway"},
            config={**CONFIG, "algo": {**CONFIG["algo"], "beta": 0.04}},
        ),
        Case(
            "collapse_with_truncation",
            "the policy collapses onto a rambling answer that hits the limit",
            history(
                n,
                **identical(lambda s: ramp(0.3, 0.9, s, n), lambda s: 0.1),
                reward=lambda s: 0.1,
                entropy=lambda s: decay(1.0, 0.02, s, 25),
                **{"completions/clipped_ratio": lambda s: ramp(0.1, 0.95, s, n)},
            ),
            {"entropy_collapse", "truncation"},
        ),
    ]


def real_cases() -> list[Case]:
    """The real runs of tests/fixtures/doctor/: each folder holds metrics.jsonl, config.yaml and label.json."""
    out = []
    for run in sorted(p for p in REAL.glob("*") if (p / "metrics.jsonl").is_file()):
        meta = json.loads((run / "label.json").read_text())
        from rlvr.observe.run_files import read_config, read_metrics

        out.append(
            Case(
                f"real/{run.name}",
                meta["about"],
                read_metrics(run),
                set(meta["expected"]),
                set(meta.get("tolerated", ())),
                read_config(run),
                real=True,
            )
        )
    return out


def all_cases() -> list[Case]:
    return synthetic_cases() + real_cases()
