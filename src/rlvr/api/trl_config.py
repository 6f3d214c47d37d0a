"""`rlvr.GRPOConfig`: TRL 1.16's GRPOConfig (its own fields and the TrainingArguments it inherits), same names,
same defaults, same meanings. Nothing here runs: rlvr.api.trl_mapping turns a GRPOConfig into rlvr's Config,
mapping each field or refusing it by name (the table, field by field, is rlvr.api.trl_fields and docs/trl.md).

The fields are TRL's as they are, in TRL's order, so that a script's `GRPOConfig(...)` call and its reads of
`args.x` work unchanged; what a field means is TRL's documentation. Two differences: `bf16` unset means rlvr's
`model.autocast=auto` (TRL: bf16, which a CPU-only machine refuses unless use_cpu=True), and `max_prompt_length`
(gone from TRL 1.x) is accepted only to be refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class GRPOConfig:
    output_dir: Any = None
    per_device_train_batch_size: int = 8
    num_train_epochs: float = 3.0
    max_steps: int = -1
    learning_rate: float = 1e-06
    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: Any = None
    warmup_steps: int = 0
    optim: str = "adamw_torch_fused"
    optim_args: Any = None
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-08
    optim_target_modules: Any = None
    gradient_accumulation_steps: int = 1
    average_tokens_across_devices: bool = True
    max_grad_norm: float = 1.0
    label_smoothing_factor: float = 0.0
    bf16: Any = None
    fp16: bool = False
    bf16_full_eval: bool = False
    fp16_full_eval: bool = False
    tf32: Any = None
    activation_checkpointing: Any = None
    activation_checkpointing_kwargs: Any = None
    gradient_checkpointing: bool = True
    gradient_checkpointing_kwargs: Any = None
    torch_compile: bool = False
    torch_compile_backend: Any = None
    torch_compile_mode: Any = None
    use_liger_kernel: bool = False
    liger_kernel_config: Any = None
    use_cache: bool = False
    neftune_noise_alpha: Any = None
    torch_empty_cache_steps: Any = None
    auto_find_batch_size: bool = False
    logging_strategy: str = "steps"
    logging_steps: float = 10
    logging_first_step: bool = False
    log_on_each_node: bool = True
    logging_nan_inf_filter: bool = True
    include_num_input_tokens_seen: str = "no"
    log_level: str = "passive"
    log_level_replica: str = "warning"
    disable_tqdm: Any = None
    report_to: str = "none"
    run_name: Any = None
    project: str = "huggingface"
    trackio_space_id: Any = None
    trackio_bucket_id: Any = None
    trackio_static_space_id: Any = None
    eval_strategy: str = "no"
    eval_steps: Any = None
    eval_delay: int = 0
    per_device_eval_batch_size: int = 8
    prediction_loss_only: bool = False
    eval_on_start: bool = False
    eval_do_concat_batches: bool = True
    eval_use_gather_object: bool = False
    eval_accumulation_steps: Any = None
    include_for_metrics: Any = field(default_factory=lambda: [])
    batch_eval_metrics: bool = False
    save_only_model: bool = False
    save_strategy: str = "steps"
    save_steps: int = 500
    save_on_each_node: bool = False
    save_total_limit: Any = None
    enable_jit_checkpoint: bool = False
    push_to_hub: bool = False
    hub_token: Any = None
    hub_private_repo: Any = None
    hub_model_id: Any = None
    hub_strategy: str = "every_save"
    hub_always_push: bool = False
    hub_revision: Any = None
    load_best_model_at_end: bool = False
    metric_for_best_model: Any = None
    greater_is_better: Any = None
    ignore_data_skip: bool = False
    restore_callback_states_from_checkpoint: bool = False
    full_determinism: bool = False
    seed: int = 42
    data_seed: Any = None
    use_cpu: bool = False
    accelerator_config: Any = None
    parallelism_config: Any = None
    dataloader_drop_last: bool = False
    dataloader_num_workers: int = 0
    dataloader_pin_memory: bool = True
    dataloader_persistent_workers: bool = False
    dataloader_prefetch_factor: Any = None
    dataloader_multiprocessing_context: Any = None
    dataloader_in_order: bool = True
    remove_unused_columns: bool = False
    label_names: Any = None
    train_sampling_strategy: str = "random"
    length_column_name: str = "length"
    ddp_find_unused_parameters: Any = None
    ddp_bucket_cap_mb: Any = None
    ddp_broadcast_buffers: Any = None
    ddp_static_graph: Any = None
    ddp_backend: Any = None
    ddp_timeout: int = 1800
    fsdp: Any = None
    fsdp_config: Any = None
    deepspeed: Any = None
    debug: str = ""
    skip_memory_metrics: bool = True
    do_train: bool = False
    do_eval: bool = False
    do_predict: bool = False
    resume_from_checkpoint: Any = None
    local_rank: int = -1
    model_init_kwargs: Any = None
    trust_remote_code: bool = False
    router_aux_loss_coef: Any = None
    disable_dropout: bool = False
    cast_lm_head_to_fp32: bool = False
    num_generations: int = 8
    num_generations_eval: Any = None
    max_completion_length: int = 512
    ds3_gather_for_generation: bool = True
    shuffle_dataset: bool = True
    pad_to_multiple_of: str = "auto"
    generation_batch_size: Any = None
    steps_per_generation: Any = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: Any = None
    generation_kwargs: Any = None
    chat_template_kwargs: Any = None
    repetition_penalty: float = 1.0
    cache_implementation: Any = None
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_model_impl: str = "vllm"
    vllm_enable_sleep_mode: bool = False
    vllm_structured_outputs_regex: Any = None
    vllm_server_base_url: Any = None
    vllm_server_host: str = "0.0.0.0"
    vllm_server_port: int = 8000
    vllm_server_timeout: float = 240.0
    vllm_group_port: int = 51216
    vllm_gpu_memory_utilization: float = 0.3
    vllm_max_model_length: Any = None
    vllm_tensor_parallel_size: int = 1
    beta: float = 0.0
    num_iterations: int = 1
    epsilon: float = 0.2
    delta: Any = None
    epsilon_high: Any = None
    sapo_temperature_neg: float = 1.05
    sapo_temperature_pos: float = 1.0
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    importance_sampling_level: str = "token"
    reward_weights: Any = None
    multi_objective_aggregation: str = "sum_then_normalize"
    scale_rewards: str = "group"
    loss_type: str = "dapo"
    mask_truncated_completions: bool = False
    sync_ref_model: bool = False
    ref_model_mixup_alpha: float = 0.6
    ref_model_sync_steps: int = 512
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0
    use_adaptive_entropy: bool = False
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_delta: float = 0.005
    entropy_target: float = 0.2
    max_tool_calling_iterations: Any = None
    vllm_importance_sampling_correction: bool = True
    vllm_importance_sampling_mode: str = "sequence_mask"
    vllm_importance_sampling_clip_max: float = 3.0
    vllm_importance_sampling_clip_min: Any = None
    off_policy_mask_threshold: Any = None
    use_bias_correction_kl: bool = True
    log_completions: bool = False
    log_multimodal: bool = True
    num_completions_to_print: Any = None
    log_unique_prompts: bool = False
    log_completions_hub_repo: Any = None
    use_transformers_continuous_batching: bool = False
    transformers_continuous_batching_config: Any = None
    use_transformers_paged: bool = False
    vllm_importance_sampling_cap: Any = None
    max_prompt_length: Any = None  # not TRL 1.16's: refused with the reason (old scripts set it)

    def to_dict(self) -> dict[str, Any]:
        """Every field and its value (TrainingArguments.to_dict's shape)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def world_size(self) -> int:
        import os

        return int(os.environ.get("WORLD_SIZE", "1"))

    @property
    def process_index(self) -> int:
        import os

        return int(os.environ.get("RANK", "0"))

    @property
    def should_save(self) -> bool:
        return self.process_index == 0


def trl_defaults() -> dict[str, Any]:
    """Each field's default, as TRL 1.16 has it."""
    return GRPOConfig().to_dict()
