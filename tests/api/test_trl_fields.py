"""Every field of TRL 1.16's GRPOConfig is mapped to an rlvr setting, accepted with a note saying it changes
nothing, or refused by name (rlvr.api.trl_fields; docs/trl.md prints the table)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.api.trl_config import GRPOConfig, trl_defaults
from rlvr.api.trl_fields import RULES, table
from rlvr.api.trl_mapping import settings
from rlvr.config import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "trl.md"

# a valid value away from TRL's default for every mapped field, and the rlvr setting it must change
MAPPED = {
    "output_dir": ("o2", "output_dir", "o2"),
    "per_device_train_batch_size": (16, "optim.micro_batch_size", 16),
    "num_train_epochs": (2.0, "steps", 1600),  # 800 rows, 1 prompt per generation
    "max_steps": (7, "steps", 7),
    "learning_rate": (3e-5, "optim.lr", 3e-5),
    "lr_scheduler_type": ("cosine", "optim.lr_schedule", "cosine"),
    "warmup_steps": (5, "optim.warmup_steps", 5),
    "weight_decay": (0.1, "optim.weight_decay", 0.1),
    "adam_beta1": (0.8, "optim.beta1", 0.8),
    "adam_beta2": (0.99, "optim.beta2", 0.99),
    "gradient_accumulation_steps": (2, "rollout.prompts_per_step", 2),
    "max_grad_norm": (0.5, "optim.max_grad_norm", 0.5),
    "bf16": (True, "model.autocast", "bf16"),
    "activation_checkpointing": (False, "model.gradient_checkpointing", False),
    "gradient_checkpointing": (False, "model.gradient_checkpointing", False),
    "torch_compile": (True, "optim.compile", "on"),
    "report_to": ("tensorboard", "logging.report_to", ["tensorboard"]),
    "eval_strategy": ("steps", "eval.every", 10),  # eval_steps None: logging_steps
    "eval_steps": (4, None, None),  # with eval_strategy=steps (below)
    "eval_on_start": (True, "eval.before_after", True),
    "save_strategy": ("no", "checkpoint.every", 0),
    "save_steps": (20, "checkpoint.every", 20),
    "save_total_limit": (3, "checkpoint.keep", 3),
    "seed": (7, "seed", 7),
    "use_cpu": (True, "device", "cpu"),
    "train_sampling_strategy": ("sequential", "data.shuffle", False),
    "ddp_backend": ("gloo", "dist.backend", "gloo"),
    "ddp_timeout": (60, "dist.timeout", 60.0),
    "fsdp": ("full_shard", "dist.strategy", "fsdp"),
    "model_init_kwargs": ({"dtype": "bfloat16"}, "model.dtype", "bfloat16"),
    "trust_remote_code": (True, "model.trust_remote_code", True),
    "num_generations": (4, "rollout.prompts_per_step", 2),
    "num_generations_eval": (2, "eval.samples", 2),
    "max_completion_length": (64, "rollout.max_new_tokens", 64),
    "shuffle_dataset": (False, "data.shuffle", False),
    "adam_epsilon": (1e-6, "optim.eps", 1e-6),
    "disable_dropout": (True, "model.disable_dropout", True),
    "chat_template_kwargs": ({"enable_thinking": False}, "data.chat_template_kwargs", {"enable_thinking": False}),
    "generation_batch_size": (32, "rollout.prompts_per_step", 4),
    "steps_per_generation": (4, "optim.steps_per_generation", 4),
    "temperature": (0.7, "rollout.temperature", 0.7),
    "top_p": (0.9, "rollout.top_p", 0.9),
    "top_k": (20, "rollout.top_k", 20),
    "min_p": (0.1, "rollout.min_p", 0.1),
    "repetition_penalty": (1.2, "rollout.repetition_penalty", 1.2),
    "generation_kwargs": ({"top_k": 7, "repetition_penalty": 1.1}, "rollout.top_k", 7),
    "use_vllm": (True, "rollout.engine", "vllm"),
    "vllm_mode": ("server", None, None),
    "vllm_enable_sleep_mode": (True, None, None),
    "vllm_server_base_url": ("http://10.0.0.5:8000", None, None),
    "vllm_server_host": ("10.0.0.6", None, None),
    "vllm_server_port": (9000, None, None),
    "vllm_server_timeout": (30.0, None, None),
    "vllm_gpu_memory_utilization": (0.5, None, None),
    "vllm_max_model_length": (2048, None, None),
    "scale_rewards": ("batch", "algo.scale_rewards", "batch"),
    "multi_objective_aggregation": ("normalize_then_sum", "algo.reward_aggregation", "normalize_then_sum"),
    "max_tool_calling_iterations": (2, None, None),  # with tools (below)
    "use_adaptive_entropy": (True, None, None),
    "entropy_target": (0.5, None, None),
    "entropy_coef_delta": (0.01, None, None),
    "entropy_coef_min": (0.001, None, None),
    "entropy_coef_max": (0.5, None, None),
    "vllm_importance_sampling_correction": (False, None, None),
    "vllm_importance_sampling_mode": ("token_truncate", None, None),
    "vllm_importance_sampling_clip_max": (2.0, None, None),
    "vllm_importance_sampling_cap": (2.0, None, None),
    "vllm_importance_sampling_clip_min": (0.5, None, None),
    "sync_ref_model": (True, None, None),
    "metric_for_best_model": ("reward", None, None),
    "greater_is_better": (False, None, None),
    "load_best_model_at_end": (True, None, None),
    "ref_model_mixup_alpha": (0.5, None, None),
    "ref_model_sync_steps": (64, None, None),
    "use_bias_correction_kl": (False, None, None),  # with beta > 0 (below)
    "log_completions": (True, "logging.completions_every", 10),
    "num_completions_to_print": (3, "logging.num_completions", 3),
}
# act outside the config: on the callbacks' on_log, the live display, GRPOTrainer's rewards (tests/api/test_trl_trainer.py)
OUTSIDE = {"optim", "disable_tqdm", "logging_strategy", "logging_steps", "logging_first_step", "reward_weights"}
CONTROLLER = ("use_adaptive_entropy", "entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max")
ALGO = [n for n, r in RULES.items() if r.what.startswith(f"algo.{n}:") and n not in CONTROLLER]
ALGO_VALUES = {"loss_type": "grpo", "importance_sampling_level": "sequence", "mask_truncated_completions": True}
WITH = {  # fields that act only together with another
    "use_adaptive_entropy": ({}, "algo.adaptive_entropy", True),
    **{
        n: ({"use_adaptive_entropy": True}, f"algo.{n}", v)
        for n, v in [("entropy_target", 0.5), ("entropy_coef_delta", 0.01), ("entropy_coef_min", 0.001), ("entropy_coef_max", 0.5)]
    },
    "eval_steps": ({"eval_strategy": "steps"}, "eval.every", 4),
    "vllm_mode": ({"use_vllm": True}, "rollout.servers", ["http://127.0.0.1:8000"]),
    "vllm_enable_sleep_mode": ({"use_vllm": True}, "rollout.vllm.sleep", True),
    "vllm_server_base_url": ({"use_vllm": True, "vllm_mode": "server"}, "rollout.servers", ["http://10.0.0.5:8000"]),
    "vllm_server_host": ({"use_vllm": True, "vllm_mode": "server"}, "rollout.servers", ["http://10.0.0.6:8000"]),
    "vllm_server_port": ({"use_vllm": True, "vllm_mode": "server"}, "rollout.servers", ["http://127.0.0.1:9000"]),
    "vllm_server_timeout": ({"use_vllm": True, "vllm_mode": "server"}, "rollout.server_timeout_s", 30.0),
    "vllm_gpu_memory_utilization": ({"use_vllm": True}, "rollout.vllm.gpu_memory_utilization", 0.5),
    "vllm_max_model_length": ({"use_vllm": True}, "rollout.vllm.max_model_len", 2048),
    "vllm_importance_sampling_correction": ({"use_vllm": True}, "algo.sampler_correction", "none"),
    "vllm_importance_sampling_mode": ({"use_vllm": True}, "algo.sampler_correction", "token_truncate"),
    "vllm_importance_sampling_clip_max": ({"use_vllm": True}, "algo.sampler_correction_cap", 2.0),
    "vllm_importance_sampling_cap": ({"use_vllm": True}, "algo.sampler_correction_cap", 2.0),
    "vllm_importance_sampling_clip_min": ({"use_vllm": True}, "algo.sampler_correction_min", 0.5),
    "sync_ref_model": ({"beta": 0.1}, "algo.ref_sync_steps", 512),
    "metric_for_best_model": ({}, "checkpoint.best_metric", "eval/reward"),
    "greater_is_better": ({"metric_for_best_model": "eval_reward"}, "checkpoint.greater_is_better", False),
    "load_best_model_at_end": ({"metric_for_best_model": "reward"}, "checkpoint.load_best_at_end", True),
    "ref_model_mixup_alpha": ({"beta": 0.1, "sync_ref_model": True}, "algo.ref_sync_alpha", 0.5),
    "ref_model_sync_steps": ({"beta": 0.1, "sync_ref_model": True}, "algo.ref_sync_steps", 64),
    "use_bias_correction_kl": ({"beta": 0.1}, "algo.kl_bias_correction", False),
    "max_tool_calling_iterations": ({}, "tools.max_turns", 3),
}


def mapped(**fields) -> tuple[dict, list[str]]:
    return settings(GRPOConfig(**fields), world_size=1, rows=800, has_eval=True, has_tools=True)


def other_value(default):
    """A value away from `default` (refused and no-effect fields: any such value must be named)."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 3
    if isinstance(default, str):
        return default + "_x"
    if isinstance(default, dict):
        return {"x": 1}
    return ["x"] if isinstance(default, list) else "x"


def test_every_trl_field_has_a_rule_and_docs_print_the_table():
    assert set(RULES) == set(trl_defaults()), "a GRPOConfig field without a rule, or a rule for no field"
    assert len(RULES) == 192  # TRL 1.16's 191 fields and max_prompt_length, which TRL 1.x removed
    assert "\n".join(table()) in DOCS.read_text(), "docs/trl.md's table is rlvr.api.trl_fields.table(); regenerate it"


@pytest.mark.parametrize("name", [n for n, r in RULES.items() if r.kind == "refused"])
def test_a_refused_field_away_from_its_default_is_an_error_naming_it(name):
    value = other_value(trl_defaults()[name])
    with pytest.raises(ConfigError, match=rf"- {name}="):
        mapped(**{name: value})


@pytest.mark.parametrize("name", [n for n, r in RULES.items() if r.kind == "no_effect"])
def test_a_no_effect_field_away_from_its_default_prints_a_note_naming_it(name):
    _, notes = mapped(**{name: other_value(trl_defaults()[name])})
    assert any(n.startswith(f"GRPOConfig {name}=") and "changes nothing in rlvr" in n for n in notes), notes


OWN_TEST = {"lr_scheduler_kwargs"}  # needs its schedule: tests/api/test_trl_schedules.py


@pytest.mark.parametrize("name", [n for n, r in RULES.items() if r.kind == "mapped" and n not in OUTSIDE | OWN_TEST])
def test_a_mapped_field_sets_its_rlvr_setting(name):
    base, _ = mapped()
    if name in ALGO:
        value = ALGO_VALUES.get(name, 0.5 if name != "num_iterations" else 2)
        key, expected = f"algo.{name}", value
        extra: dict = {}
    elif name in WITH:
        extra, key, expected = WITH[name]
        value = MAPPED[name][0]
        base, _ = mapped(**extra)
    else:
        value, key, expected = MAPPED[name]
        extra = {}
    got, _ = mapped(**extra, **{name: value})
    assert got[key] == expected and got.get(key) != base.get(key), (name, got.get(key), base.get(key))


def test_optim_takes_adamw_by_any_of_its_names_and_refuses_others():
    assert mapped(optim="adamw_torch")[0] == mapped()[0]
    with pytest.raises(ConfigError, match=r"- optim='adamw_8bit': rlvr's optimizer is AdamW"):
        mapped(optim="adamw_8bit")


def test_a_trl_script_gets_trls_loss_without_rlvrs_clip_cov():
    """Clip-Cov is on in rlvr's defaults; TRL has none, so a GRPOConfig pins it off, and the run is TRL's loss."""
    from rlvr.config import Config

    assert Config().algo.clip_cov_ratio > 0
    assert mapped()[0]["algo.clip_cov_ratio"] == 0
    assert mapped(loss_type="grpo", beta=0.04)[0]["algo.clip_cov_ratio"] == 0


def test_batch_arithmetic_is_trls():
    # 2 processes x 4 per device x steps_per_generation 6 = 48 completions = 12 prompts x 4; 3 accumulation steps: 2 updates
    s, _ = settings(
        GRPOConfig(
            per_device_train_batch_size=4,
            gradient_accumulation_steps=3,
            steps_per_generation=6,
            num_generations=4,
            max_steps=9,
            num_iterations=2,
        ),
        world_size=2,
        rows=100,
        has_eval=False,
        has_tools=False,
    )
    assert (s["rollout.prompts_per_step"], s["optim.steps_per_generation"], s["steps"]) == (12, 2, 3)  # 4 updates per step
    with pytest.raises(ConfigError, match="steps_per_generation=4 must be a multiple of gradient_accumulation_steps=3"):
        mapped(gradient_accumulation_steps=3, steps_per_generation=4)
    with pytest.raises(ConfigError, match="num_generations=3 must divide the generation batch"):
        mapped(num_generations=3)


def test_generation_kwargs_win_over_the_fields_and_other_keys_are_refused_by_name():
    got, _ = mapped(top_p=0.9, generation_kwargs={"top_p": 0.8, "min_p": 0.05})
    assert (got["rollout.top_p"], got["rollout.min_p"]) == (0.8, 0.05)  # TRL: generation_kwargs override the fields
    with pytest.raises(ConfigError, match=r"generation_kwargs\['do_sample'\]=False: rlvr samples with temperature, top_p"):
        mapped(generation_kwargs={"do_sample": False})


def test_sync_ref_model_needs_beta_and_its_steps_alone_change_nothing():
    with pytest.raises(ConfigError, match=r"sync_ref_model=True: with beta=0.0 there is no reference model to synchronise"):
        mapped(sync_ref_model=True)
    got, notes = mapped(ref_model_sync_steps=8, beta=0.1)
    assert got["algo.ref_sync_steps"] == 0
    assert "GRPOConfig ref_model_sync_steps=8 changes nothing in rlvr: used only with sync_ref_model" in notes


def test_best_model_fields_need_a_metric_rlvrs_evaluation_computes():
    for fields in ({"load_best_model_at_end": True}, {"save_strategy": "best"}):
        with pytest.raises(ConfigError, match=r"needs metric_for_best_model: TRL's default, the evaluation loss, is not computed"):
            mapped(**fields)
    got, _ = mapped(save_strategy="best", metric_for_best_model="eval_rewards/len/mean")
    assert (got["checkpoint.every"], got["checkpoint.best_metric"], got["checkpoint.greater_is_better"]) == (
        0,
        "eval/rewards/len/mean",
        True,
    )
    assert mapped(metric_for_best_model="kl_loss")[0]["checkpoint.greater_is_better"] is False  # transformers' default for a loss
    _, notes = mapped(greater_is_better=False)
    assert "GRPOConfig greater_is_better=False changes nothing in rlvr: used only with metric_for_best_model" in notes
