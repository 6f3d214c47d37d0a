"""A prompt set split into prompts always solved and prompts never solved is one finding
(`prompts_split`) with the one fix that serves both halves, not `prompts_too_easy` and
`prompts_too_hard` with opposite fixes."""

import json

from _doctor_cases import CONFIG, history, identical
from _runs import write_metrics

from rlvr.observe.doctor import Context, diagnose

# 67 % of groups identical: 35 % of all groups all right, 32 % all wrong; the policy explores.
SPLIT = history(30, **identical(lambda s: 0.67, lambda s: 35 / 67), reward=lambda s: 0.5, entropy=lambda s: 0.9)


def test_rlvr_doctor_names_a_split_prompt_set_once(tmp_path, rlvr_cli):
    run = write_metrics(tmp_path / "run", SPLIT)
    (run / "config.yaml").write_text(json.dumps(CONFIG))  # JSON is YAML
    proc = rlvr_cli("doctor", run, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines()[0] == f"{run}: 1 finding(s)"
    assert "prompts_too_easy" not in proc.stdout and "prompts_too_hard" not in proc.stdout
    assert (
        "[warning] prompts_split (frac_reward_zero_std): 67% of groups had identical rewards (steps 21-30): 35% of groups all at "
        "the step's top reward, 32% all at its bottom, and give no gradient: the prompt set is split, some prompts always "
        "solved and others never (not too easy or too hard as a whole)"
    ) in proc.stdout
    assert (
        "fix: keep the prompts in between: filter the data by difficulty (sample a few completions per prompt, drop the prompts "
        "that all or none of them solve) or order it as a curriculum; or set algo.dynamic_sampling=true, which drops groups "
        "whose rewards are all equal (both kinds) and draws fresh prompts in their place"
    ) in proc.stdout
    assert "easier" not in proc.stdout and "harder" not in proc.stdout  # no fix that helps only one half


def test_with_dynamic_sampling_on_the_fix_is_more_resample_rounds():
    config = {**CONFIG, "algo": {**CONFIG["algo"], "dynamic_sampling": True, "max_resample_rounds": 4}}
    (f,) = diagnose(SPLIT, Context(config=config))
    assert f.rule == "prompts_split" and f.fix.endswith("; dynamic sampling is on: raise algo.max_resample_rounds (now 4)")


def test_one_side_alone_is_still_too_easy_or_too_hard():
    easy = history(30, **identical(lambda s: 0.67, lambda s: 0.9), reward=lambda s: 0.9, entropy=lambda s: 0.9)
    hard = history(30, **identical(lambda s: 0.67, lambda s: 0.1), reward=lambda s: 0.1, entropy=lambda s: 0.9)
    assert [f.rule for f in diagnose(easy, Context(config=CONFIG))] == ["prompts_too_easy"]
    assert [f.rule for f in diagnose(hard, Context(config=CONFIG))] == ["prompts_too_hard"]
