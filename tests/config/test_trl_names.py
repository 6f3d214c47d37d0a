"""TRL's names for settings in config keys get rlvr's name as the hint (not a did-you-mean on
spelling), at the top level or nested under any section, from the command line or a YAML file;
`rlvr train --help-config` and docs/config.md carry the whole TRL -> rlvr table."""

import re

import pytest

from rlvr.config import TRL_NAMES, ConfigError, load_config, trl_table
from rlvr.config.load import _valid_keys
from _paths import REPO

DOCS = REPO / "docs" / "config.md"

# Every field of TRL 1.16's GRPOConfig (its own and those it overrides from TrainingArguments).
GRPO_CONFIG_1_16 = """learning_rate model_init_kwargs trust_remote_code router_aux_loss_coef disable_dropout cast_lm_head_to_fp32
remove_unused_columns num_generations num_generations_eval max_completion_length ds3_gather_for_generation shuffle_dataset
pad_to_multiple_of generation_batch_size steps_per_generation temperature top_p top_k min_p generation_kwargs chat_template_kwargs
repetition_penalty cache_implementation use_vllm vllm_mode vllm_model_impl vllm_enable_sleep_mode vllm_structured_outputs_regex
vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout vllm_group_port vllm_gpu_memory_utilization
vllm_max_model_length vllm_tensor_parallel_size beta num_iterations epsilon delta epsilon_high sapo_temperature_neg
sapo_temperature_pos vespo_k_pos vespo_lambda_pos vespo_k_neg vespo_lambda_neg importance_sampling_level reward_weights
multi_objective_aggregation scale_rewards loss_type mask_truncated_completions sync_ref_model ref_model_mixup_alpha
ref_model_sync_steps top_entropy_quantile entropy_coef use_adaptive_entropy entropy_coef_min entropy_coef_max entropy_coef_delta
entropy_target max_tool_calling_iterations vllm_importance_sampling_correction vllm_importance_sampling_mode
vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min off_policy_mask_threshold use_bias_correction_kl log_completions
log_multimodal num_completions_to_print log_unique_prompts log_completions_hub_repo use_transformers_continuous_batching
transformers_continuous_batching_config use_transformers_paged vllm_importance_sampling_cap logging_steps gradient_checkpointing
bf16 lr_scheduler_kwargs use_liger_kernel torch_empty_cache_steps""".split()
TRAINING_ARGUMENTS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "save_steps",
    "output_dir",
    "seed",
    "lr_scheduler_type",
    "warmup_ratio",
    "warmup_steps",
    "weight_decay",
    "max_grad_norm",
    "adam_beta1",
    "adam_beta2",
    "save_total_limit",
    "eval_strategy",
    "eval_steps",
    "report_to",
    "push_to_hub",
)


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "num_generations=4",
            "unknown config key `num_generations` in the command line: TRL's `num_generations` is rlvr's "
            "`rollout.group_size` (completions sampled per prompt)",
        ),
        (
            "max_completion_length=256",
            "unknown config key `max_completion_length` in the command line: TRL's `max_completion_length` "
            "is rlvr's `rollout.max_new_tokens`",
        ),
        (
            "learning_rate=1e-6",
            "unknown config key `learning_rate` in the command line: TRL's `learning_rate` is rlvr's `optim.lr` "
            "(TRL's GRPO default is 1e-6; rlvr's 3e-4 suits the bundled tiny model)",
        ),
        (
            "rollout.num_generations=4",
            "unknown config key `rollout.num_generations` in the command line: TRL's `num_generations` is "
            "rlvr's `rollout.group_size` (completions sampled per prompt)",
        ),
        ("optim.beta=0.04", "unknown config key `optim.beta` in the command line: TRL's `beta` is rlvr's `algo.beta`"),
        ("use_vllm=true", "unknown config key `use_vllm` in the command line: TRL's `use_vllm` is rlvr's `rollout.engine=vllm`"),
        (
            "sync_ref_model=true",
            "unknown config key `sync_ref_model` in the command line: TRL's `sync_ref_model` is rlvr's `algo.ref_sync_steps` "
            "(sync_ref_model=True, ref_model_sync_steps=N is algo.ref_sync_steps=N)",
        ),
        (
            "vllm_tensor_parallel_size=2",
            "unknown config key `vllm_tensor_parallel_size` in the command line: TRL's `vllm_tensor_parallel_size` has no rlvr "
            "equivalent: each rank's vLLM holds the whole model (tensor parallel size 1)",
        ),
        (
            "model_init_kwargs.torch_dtype=bfloat16",
            "unknown config key `model_init_kwargs.torch_dtype` in the command line: TRL's "
            "`model_init_kwargs` has no rlvr equivalent: the loading options are model.dtype, "
            "model.trust_remote_code and model.gguf_file",
        ),
        (
            "model=Qwen/Qwen2.5-0.5B-Instruct",
            "`model` must be a mapping, got 'Qwen/Qwen2.5-0.5B-Instruct': TRL's `model` is rlvr's "
            "`model.path` (rlvr's `model` is a section: the model itself is model.path)",
        ),
        (
            "optim=adamw_torch",
            "`optim` must be a mapping, got 'adamw_torch': TRL's `optim` has no rlvr equivalent: the optimizer is "
            "always AdamW; rlvr's `optim` section holds its settings (optim.lr, optim.beta1, ...)",
        ),
        # not TRL names: a field under the wrong section gets its place, a misspelling the closest key
        ("optim.group_size=4", "unknown config key `optim.group_size` in the command line; did you mean `rollout.group_size`?"),
        ("optim.lrr=1e-5", "unknown config key `optim.lrr` in the command line; did you mean `optim.lr`?"),
    ],
)
def test_a_trl_name_on_the_command_line_gets_rlvrs_name(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value) == message


def test_a_trl_name_in_yaml_at_the_top_or_in_a_section(tmp_path):
    for text, key in [
        ("num_generations: 4\n", "num_generations"),
        ("rollout:\n  num_generations: 4\n", "rollout.num_generations"),
        ("optim:\n  learning_rate: 1.0e-6\n", "optim.learning_rate"),
    ]:
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_config(path)
        trl = key.rsplit(".", 1)[-1]
        assert str(e.value).startswith(f"unknown config key `{key}` in {path}: TRL's `{trl}` is rlvr's `{TRL_NAMES[trl].rlvr}`")


def test_rlvr_train_with_trl_names_exits_2_with_the_hint(rlvr_cli, tmp_path):
    proc = rlvr_cli("train", "num_generations=4", f"output_dir={tmp_path / 'run'}", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "rlvr: error: unknown config key `num_generations` in the command line: TRL's `num_generations` "
        "is rlvr's `rollout.group_size` (completions sampled per prompt)"
    )
    assert not (tmp_path / "run").exists()


def test_the_table_covers_trl_and_points_at_real_settings():
    assert set(GRPO_CONFIG_1_16) <= set(TRL_NAMES), set(GRPO_CONFIG_1_16) - set(TRL_NAMES)
    assert set(TRAINING_ARGUMENTS) <= set(TRL_NAMES)
    valid = set(_valid_keys())
    for name, entry in TRL_NAMES.items():
        if entry.rlvr is None:
            assert entry.note, f"{name}: say why rlvr has no equivalent"
            continue
        key = entry.rlvr.split("=", 1)[0]
        assert key in valid, (name, entry.rlvr)
        if "=" in entry.rlvr:  # a setting: it must load as it is written
            load_config(None, [entry.rlvr])


def test_help_config_and_docs_carry_the_table(rlvr_cli):
    proc = rlvr_cli("train", "--help-config", timeout=60)
    assert proc.returncode == 0
    section = proc.stdout.split("\nTRL's names -> rlvr's", 1)[1].splitlines()[1:]
    assert section == trl_table()
    assert re.search(r"^  num_generations +rollout.group_size  -- completions sampled per prompt$", proc.stdout, re.M)
    assert re.search(r"^  learning_rate +optim.lr  -- ", proc.stdout, re.M)
    assert re.search(r"^  max_completion_length +rollout.max_new_tokens$", proc.stdout, re.M)
    docs = DOCS.read_text()
    assert "\n".join(trl_table(markdown=True)) in docs, "docs/config.md's table is trl_table(markdown=True); regenerate it"
