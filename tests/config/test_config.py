"""Config: YAML + dotted overrides, unknown keys with suggestions, validation naming fields."""

import pytest

from rlvr.config import REGISTERED, ConfigError, load_config, validate
from rlvr.training.setup import check_config, registered_choices


def test_yaml_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lr: 1.0e-3\nrollout:\n  group_size: 4\nrewards:\n  - fn: arithmetic\n")
    cfg = load_config(f, ["rollout.group_size=6", "optim.lr=1e-5", "rewards.1.fn=my.py:fn", "rewards.1.weight=0.5"])
    assert cfg.rollout.group_size == 6 and cfg.optim.lr == 1e-5
    assert [(r.fn, r.weight) for r in cfg.rewards] == [("arithmetic", 1.0), ("my.py:fn", 0.5)]
    assert cfg.rollout.completions_per_step == 6 * cfg.rollout.prompts_per_step


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lrr=1", "unknown config key `optim.lrr`.*did you mean `optim.lr`"),
        ("rolout.group_size=4", "did you mean `rollout.group_size`"),
        ("rollout.group_size=four", "`rollout.group_size` must be an integer"),
        ("algo.beta=yes please", "`algo.beta` must be a number"),
    ],
)
def test_bad_overrides_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_unknown_yaml_key(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("algo:\n  loss_typ: grpo\n")
    with pytest.raises(ConfigError, match=r"algo.loss_typ.*c.yaml.*did you mean `algo.loss_type`"):
        load_config(f)


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.group_size=1", "rollout.group_size` must be at least 2"),
        ("rollout.temperature=0", "rollout.temperature` is 0"),
        ("rollout.max_new_tokens=0", "rollout.max_new_tokens` must be positive"),
        ("optim.lr=0", "optim.lr` must be positive"),
        ("algo.loss_type=dapoo", "algo.loss_type.*did you mean 'dapo'"),
        ("optim.micro_batch_size=-1", "optim.micro_batch_size` must be >= 0"),
        ("optim.compile=of", "optim.compile.*did you mean 'off'"),
        ("algo.std_eps=-1e-4", "algo.std_eps` must be >= 0, got -0.0001"),
        ("rollout.min_p=1.5", "rollout.min_p` must be in \\[0, 1\\], got 1.5"),
        ("rollout.repetition_penalty=0", "rollout.repetition_penalty` must be positive \\(1: off\\), got 0"),
        ("optim.eps=-1", "optim.eps` must be >= 0, got -1"),
    ],
)
def test_validation_names_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        check_config(load_config(None, [override]))


def test_repetition_penalty_is_rlvrs_own_generations():
    with pytest.raises(ConfigError, match="rollout.repetition_penalty` applies to rlvr's own generation"):
        check_config(load_config(None, ["rollout.repetition_penalty=1.2", "rollout.function=my.py:rollout"]))


def test_eval_reward_all_needs_reward_functions():
    with pytest.raises(ConfigError, match=r"`eval.reward`=all sums the training's reward functions \(rewards.\*\), and rewards is empty"):
        check_config(load_config(None, ["eval.reward=all", "rewards=[]", "tools.environment=guess_number"]))


def test_on_and_off_unquoted_are_the_strings(tmp_path):
    """YAML reads on/off unquoted as booleans: a string setting gets them back as written."""
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  compile: on\n")
    assert load_config(f).optim.compile == "on"
    assert load_config(f, ["optim.compile=off"]).optim.compile == "off"
    with pytest.raises(ConfigError, match="optim.compile`=on is not supported with nproc > 1.*optim.compile=off"):
        check_config(load_config(f, ["nproc=2"]))


def test_registered_settings_are_checked_against_the_choices_given():
    """rlvr.config imports nothing above it: the valid names of registry-backed settings arrive as
    `choices` (rlvr.training.setup passes the registries), and all of them must be given."""
    cfg = load_config(None, [])
    choices = registered_choices()
    assert set(choices) == set(REGISTERED)
    validate(cfg, choices=choices)
    with pytest.raises(ValueError, match="no choices given for.*algo.loss_type"):
        validate(cfg, choices={k: v for k, v in choices.items() if k != "algo.loss_type"})
    with pytest.raises(ConfigError, match=r"`algo.loss_type` must be one of \['grpo'\], got 'dapo'"):
        validate(cfg, choices={**choices, "algo.loss_type": ["grpo"]})


FSDP = ["nproc=2", "dist.strategy=fsdp"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ([*FSDP, "model.lora.r=4", "model.lora.save_merged=true"], "save_merged` is not implemented with dist.strategy=fsdp"),
        ([*FSDP, "rollout.engine=vllm"], "engine`=vllm with dist.strategy=fsdp is not supported"),
    ],
)
def test_fsdp_refusals(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_config(load_config(None, overrides))
    check_config(load_config(None, FSDP + ["model.lora.r=4"]))  # LoRA itself is fine (tests/dist/test_dist.py)
    # Checkpoints and resume work under FSDP2 (written unsharded, as one process writes them)
    check_config(load_config(None, FSDP + ["save_every=5", "resume=auto", "model.lora.r=4"]))


def test_group_size_two_warns_and_kl_note():
    warnings = check_config(load_config(None, ["rollout.group_size=2"]))
    assert any("group_size=2" in w for w in warnings)
    assert any("no reference model" in w for w in warnings)


def test_negative_intervals_and_counts_are_refused_naming_the_key():
    cfg = load_config(None, ["checkpoint.every=-1", "checkpoint.keep=-1", "logging.completions_every=-2", "logging.num_completions=-1"])
    with pytest.raises(ConfigError) as e:
        check_config(cfg)
    text = str(e.value)
    assert "`checkpoint.every` must be >= 0 (0: only at the end and at a stop), got -1" in text
    assert "`checkpoint.keep` must be >= 0 (0: keep every one), got -1" in text
    assert "`logging.completions_every` must be >= 0 (0: never), got -2" in text
    assert "`logging.num_completions` must be >= 0 (0: none), got -1" in text


def test_kl_cov_asks_to_turn_off_the_default_clip_cov():
    """Clip-Cov is on by default; KL-Cov is the other remedy for the same thing, so asking for it names the switch."""
    with pytest.raises(ConfigError, match=r"Clip-Cov is on by default, at 0.02: KL-Cov needs algo.clip_cov_ratio=0"):
        check_config(load_config(None, ["algo.kl_cov_ratio=2e-4"]))
    check_config(load_config(None, ["algo.kl_cov_ratio=2e-4", "algo.clip_cov_ratio=0"]))


def test_sampler_correction_bounds_and_modes():
    """TRL's four importance-sampling modes and its lower bound; the bounds checked, vespo kept to per-token weights."""
    vllm = ["rollout.engine=vllm"]
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        check_config(load_config(None, [*vllm, f"algo.sampler_correction={mode}", "algo.sampler_correction_min=0.5"]))
    check_config(load_config(None, [*vllm, "algo.sampler_correction_cap=.inf"]))  # TRL's clip_max=None
    with pytest.raises(ConfigError) as e:
        check_config(load_config(None, [*vllm, "algo.sampler_correction_min=3.0", "algo.sampler_correction_cap=3.0"]))
    assert "`algo.sampler_correction_min` must be in [0, algo.sampler_correction_cap) or null, got 3.0" in str(e.value)
    with pytest.raises(ConfigError, match="algo.sampler_correction=sequence_mask gives one per completion; use token_truncate"):
        check_config(load_config(None, [*vllm, "algo.loss_type=vespo", "algo.sampler_correction=sequence_mask"]))
    with pytest.raises(ConfigError, match=r"`algo.sampler_correction` must be one of .*got 'sequence'"):
        check_config(load_config(None, [*vllm, "algo.sampler_correction=sequence"]))
