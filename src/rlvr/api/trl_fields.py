"""What rlvr does with each field of TRL 1.16's GRPOConfig: `mapped` (to the rlvr setting named), `no_effect`
(accepted; a changed value prints a note saying why it changes nothing), or `refused` (a changed value is an
error naming the field). Every field is here (a test checks against TRL's own class); docs/trl.md prints the table.
"""

from __future__ import annotations

from typing import NamedTuple


class Rule(NamedTuple):
    kind: str  # mapped | no_effect | refused
    what: str  # mapped: the rlvr setting(s) it sets and how; otherwise why rlvr has no equivalent


def M(what: str) -> Rule:
    return Rule("mapped", what)


def N(why: str) -> Rule:
    return Rule("no_effect", why)


def R(why: str) -> Rule:
    return Rule("refused", why)


_BATCH = "batch: per_device_train_batch_size x gradient_accumulation_steps x world size completions per optimizer step"
_NO_LOADER = "rlvr reads the rows in process: there is no DataLoader"
_HUB = "rlvr does not upload; the trained model is <output_dir>/final (huggingface_hub's upload_folder)"
_EVAL_ONE = "rlvr's held-out evaluation runs in one pass on rank 0"
_LOGS = "rlvr's console and metrics.jsonl"
_DDP = "rlvr's DDP wrapper sets its own options"
_ALGO = "algo.{name}: same meaning and value"

RULES: dict[str, Rule] = {
    # TrainingArguments
    "output_dir": M("output_dir (None: trainer_output, as TrainingArguments)"),
    "per_device_train_batch_size": M(f"optim.micro_batch_size, and the {_BATCH}"),
    "num_train_epochs": M("steps = ceil(epochs x rows / prompts per generation), when max_steps <= 0"),
    "max_steps": M("steps = max_steps / (optimizer steps per generation x num_iterations), TRL counting optimizer steps"),
    "learning_rate": M("optim.lr"),
    "lr_scheduler_type": M("optim.lr_schedule (constant, constant_with_warmup, linear, cosine, cosine_with_min_lr; others refused)"),
    "lr_scheduler_kwargs": M("optim.min_lr_rate: min_lr_rate, or min_lr / learning_rate (cosine_with_min_lr; other keys refused)"),
    "warmup_steps": M("optim.warmup_steps (a value below 1: that share of the optimizer steps)"),
    "optim": M("AdamW (adamw_torch, adamw_torch_fused, adamw_hf; other optimizers refused)"),
    "optim_args": R("AdamW takes learning_rate, adam_beta1/2 and weight_decay"),
    "weight_decay": M("optim.weight_decay"),
    "adam_beta1": M("optim.beta1"),
    "adam_beta2": M("optim.beta2"),
    "adam_epsilon": M("optim.eps"),
    "optim_target_modules": R("one optimizer over every trainable parameter"),
    "gradient_accumulation_steps": M(f"the {_BATCH}; rlvr accumulates micro-batches of per_device_train_batch_size"),
    "average_tokens_across_devices": R("rlvr always normalises the loss over every rank's tokens (False is not available)"),
    "max_grad_norm": M("optim.max_grad_norm"),
    "label_smoothing_factor": R("GRPO has no labels to smooth"),
    "bf16": M("model.autocast: True bf16, False none, unset auto (TRL: bf16 unless fp16)"),
    "fp16": R("no fp16 autocast: bf16=True, or model_init_kwargs={'dtype': 'float16'} for fp16 weights"),
    "bf16_full_eval": R("evaluation runs in the training precision"),
    "fp16_full_eval": R("evaluation runs in the training precision"),
    "tf32": N("rlvr leaves torch's matmul precision as it is"),
    "activation_checkpointing": M("model.gradient_checkpointing (transformers 5's name for gradient_checkpointing)"),
    "activation_checkpointing_kwargs": N("rlvr checkpoints non-reentrant, with its own options"),
    "gradient_checkpointing": M("model.gradient_checkpointing (on by default, as in TRL)"),
    "gradient_checkpointing_kwargs": N("rlvr checkpoints non-reentrant, with its own options"),
    "torch_compile": M("optim.compile=on"),
    "torch_compile_backend": R("optim.compile uses torch.compile's default backend"),
    "torch_compile_mode": R("optim.compile uses torch.compile's default mode"),
    "use_liger_kernel": N("the same loss runs through the model's own layers (Liger's fused loss saves the logits' memory)"),
    "liger_kernel_config": N("the same loss runs through the model's own layers (Liger's fused loss saves the logits' memory)"),
    "use_cache": N("generation always uses a KV cache; training forwards never do"),
    "neftune_noise_alpha": R("no embedding noise"),
    "torch_empty_cache_steps": N("rlvr frees generation memory itself"),
    "auto_find_batch_size": R("TRL refuses it for GRPO too; lower per_device_train_batch_size"),
    "logging_strategy": M("when callbacks' on_log runs and state.log_history grows (steps, epoch, no); " + _LOGS + " log every step"),
    "logging_steps": M(
        "on_log every logging_steps optimizer steps, with the metrics averaged since the last; " + _LOGS + " log every step"
    ),
    "logging_first_step": M("on_log also after the first step"),
    "log_on_each_node": N("rank 0 logs"),
    "logging_nan_inf_filter": N("rlvr skips a step whose loss or gradient is not finite, and logs it"),
    "include_num_input_tokens_seen": N("num_tokens is logged every step"),
    "log_level": N("rlvr's console prints its own lines"),
    "log_level_replica": N("rank 0 prints"),
    "disable_tqdm": M("True: no live progress display (one plain line per step)"),
    "report_to": M("logging.report_to (tensorboard, wandb, trackio; all: those installed; none: [])"),
    "run_name": N("the run is named by its output_dir"),
    "project": N("trackio's project is set by trackio's own environment variables"),
    "trackio_space_id": N("trackio's space is set by trackio's own environment variables"),
    "trackio_bucket_id": N("trackio's bucket is set by trackio's own environment variables"),
    "trackio_static_space_id": N("trackio's space is set by trackio's own environment variables"),
    "eval_strategy": M("eval.every (steps: eval_steps; epoch: the steps of one pass; no: 0) with an eval_dataset"),
    "eval_steps": M("eval.every, in optimizer steps as TRL counts them (None: logging_steps)"),
    "eval_delay": R("evaluation runs from the first due step"),
    "per_device_eval_batch_size": N(_EVAL_ONE),
    "prediction_loss_only": N(_EVAL_ONE),
    "eval_on_start": M("eval.before_after (rlvr evaluates before and after training)"),
    "eval_do_concat_batches": N(_EVAL_ONE),
    "eval_use_gather_object": N(_EVAL_ONE),
    "eval_accumulation_steps": N(_EVAL_ONE),
    "include_for_metrics": N(_EVAL_ONE),
    "batch_eval_metrics": N(_EVAL_ONE),
    "save_only_model": N("rlvr's checkpoints always hold the optimizer, scheduler, data position and RNG (to resume exactly)"),
    "save_strategy": M("checkpoint.every (steps: save_steps; epoch: the steps of one pass; no: 0; best: 0, each new best checkpointed)"),
    "save_steps": M("checkpoint.every, in optimizer steps as TRL counts them (below 1: a share of the run)"),
    "save_on_each_node": N("rank 0 writes every checkpoint"),
    "save_total_limit": M("checkpoint.keep (None: every checkpoint)"),
    "enable_jit_checkpoint": N("a first Ctrl-C (SIGINT/SIGTERM) already finishes the step and writes a checkpoint"),
    "push_to_hub": R(_HUB),
    "hub_token": N(_HUB),
    "hub_private_repo": N(_HUB),
    "hub_model_id": N(_HUB),
    "hub_strategy": N(_HUB),
    "hub_always_push": N(_HUB),
    "hub_revision": N(_HUB),
    "load_best_model_at_end": M("checkpoint.load_best_at_end (needs metric_for_best_model: rlvr's evaluation has no loss)"),
    "metric_for_best_model": M("checkpoint.best_metric: eval_<name> or <name> is eval/<name> (e.g. reward: eval/reward)"),
    "greater_is_better": M("checkpoint.greater_is_better (None: True unless the metric ends in loss, as transformers)"),
    "ignore_data_skip": R("a resumed run always continues at the data position it stopped at"),
    "restore_callback_states_from_checkpoint": N("callbacks are the script's; their state is not checkpointed"),
    "full_determinism": N("rlvr seeds every generator from `seed`; deterministic algorithms are torch's setting"),
    "seed": M("seed"),
    "data_seed": N("`seed` draws the data order, as in TRL, whose GRPO sampler (RepeatSampler) reads `seed`, not data_seed"),
    "use_cpu": M("device=cpu"),
    "accelerator_config": R("no accelerate: rlvr's own process group (torchrun) and DDP/FSDP2"),
    "parallelism_config": R("no accelerate: rlvr's own process group (torchrun) and DDP/FSDP2"),
    "dataloader_drop_last": N(_NO_LOADER),
    "dataloader_num_workers": N(_NO_LOADER),
    "dataloader_pin_memory": N(_NO_LOADER),
    "dataloader_persistent_workers": N(_NO_LOADER),
    "dataloader_prefetch_factor": N(_NO_LOADER),
    "dataloader_multiprocessing_context": N(_NO_LOADER),
    "dataloader_in_order": N(_NO_LOADER),
    "remove_unused_columns": N("every column of a row reaches the reward functions (TRL's GRPO default False)"),
    "label_names": N("GRPO has no labels"),
    "train_sampling_strategy": M("data.shuffle (random: True, sequential: False; group_by_length refused)"),
    "length_column_name": N("no length grouping"),
    "ddp_find_unused_parameters": N(_DDP),
    "ddp_bucket_cap_mb": N(_DDP),
    "ddp_broadcast_buffers": N(_DDP),
    "ddp_static_graph": N(_DDP),
    "ddp_backend": M("dist.backend"),
    "ddp_timeout": M("dist.timeout"),
    "fsdp": M("dist.strategy=fsdp when set (FSDP2 full sharding; its options refused)"),
    "fsdp_config": R("FSDP2 runs with rlvr's options (dist.strategy=fsdp)"),
    "deepspeed": R("no DeepSpeed; fsdp shards weights, gradients and optimizer state"),
    "debug": N("no debug modes"),
    "skip_memory_metrics": N("memory/peak_gib is logged on CUDA"),
    "do_train": N("scripts' flag; trainer.train() trains"),
    "do_eval": N("scripts' flag; trainer.evaluate() evaluates"),
    "do_predict": N("scripts' flag"),
    "resume_from_checkpoint": N("scripts' field; pass it to trainer.train(resume_from_checkpoint=...)"),
    "local_rank": N("torchrun's LOCAL_RANK places each process"),
    # GRPOConfig: the model
    "model_init_kwargs": M("model.dtype from dtype/torch_dtype, model.trust_remote_code; attn_implementation noted; others refused"),
    "trust_remote_code": M("model.trust_remote_code"),
    "router_aux_loss_coef": R("no MoE auxiliary loss is added"),
    "disable_dropout": M("model.disable_dropout"),
    "cast_lm_head_to_fp32": R("the output head runs in the model's dtype (or under autocast)"),
    # GRPOConfig: generation
    "num_generations": M("rollout.group_size"),
    "num_generations_eval": M(
        "eval.samples at eval.temperature=temperature, with training's top_p/top_k/min_p/repetition_penalty (None: num_generations)"
    ),
    "max_completion_length": M("rollout.max_new_tokens"),
    "ds3_gather_for_generation": N("no DeepSpeed"),
    "shuffle_dataset": M("data.shuffle"),
    "pad_to_multiple_of": N("optim.compile pads lengths to its own buckets; nothing else pads"),
    "generation_batch_size": M("rollout.prompts_per_step = generation_batch_size / num_generations"),
    "steps_per_generation": M("optim.steps_per_generation = steps_per_generation / gradient_accumulation_steps"),
    "temperature": M("rollout.temperature"),
    "top_p": M("rollout.top_p"),
    "top_k": M("rollout.top_k"),
    "min_p": M("rollout.min_p"),
    "generation_kwargs": M("rollout.<key> for temperature, top_p, top_k, min_p, repetition_penalty (over the fields); others refused"),
    "chat_template_kwargs": M("data.chat_template_kwargs"),
    "repetition_penalty": M("rollout.repetition_penalty"),
    "cache_implementation": R("the hf engine manages its own KV cache"),
    "use_vllm": M("rollout.engine=vllm (colocate), or rollout.servers (server)"),
    "vllm_mode": M("colocate: rollout.engine=vllm; server: rollout.servers=[vllm_server_base_url or http://host:port]"),
    "vllm_model_impl": R("vLLM's own model implementation is used"),
    "vllm_enable_sleep_mode": M("rollout.vllm.sleep"),
    "vllm_structured_outputs_regex": R("generation is not constrained"),
    "vllm_server_base_url": M("rollout.servers (vllm_mode=server)"),
    "vllm_server_host": M("rollout.servers (vllm_mode=server)"),
    "vllm_server_port": M("rollout.servers (vllm_mode=server)"),
    "vllm_server_timeout": M("rollout.server_timeout_s"),
    "vllm_group_port": N("the weight-sync group picks a free port and tells the server"),
    "vllm_gpu_memory_utilization": M("rollout.vllm.gpu_memory_utilization"),
    "vllm_max_model_length": M("rollout.vllm.max_model_len"),
    "vllm_tensor_parallel_size": R("vLLM runs with tensor parallel size 1"),
    # GRPOConfig: the loss
    **{
        name: M(_ALGO.format(name=name))
        for name in (
            "beta",
            "num_iterations",
            "epsilon",
            "delta",
            "epsilon_high",
            "sapo_temperature_neg",
            "sapo_temperature_pos",
            "vespo_k_pos",
            "vespo_lambda_pos",
            "vespo_k_neg",
            "vespo_lambda_neg",
            "importance_sampling_level",
            "loss_type",
            "mask_truncated_completions",
            "top_entropy_quantile",
            "entropy_coef",
            "off_policy_mask_threshold",
        )
    },
    "scale_rewards": M("algo.scale_rewards (True: group, False: none; with normalize_then_sum always group, as TRL divides there)"),
    "reward_weights": M("rewards.N.weight, one per reward function"),
    "multi_objective_aggregation": M("algo.reward_aggregation"),
    "sync_ref_model": M("algo.ref_sync_steps=ref_model_sync_steps (False: 0, the reference stays the initial policy)"),
    "ref_model_mixup_alpha": M("algo.ref_sync_alpha"),
    "ref_model_sync_steps": M("algo.ref_sync_steps, with sync_ref_model"),
    "use_adaptive_entropy": M("algo.adaptive_entropy: same meaning"),
    "entropy_coef_min": M("algo.entropy_coef_min: same meaning and value"),
    "entropy_coef_max": M("algo.entropy_coef_max: same meaning and value"),
    "entropy_coef_delta": M("algo.entropy_coef_delta: same meaning and value"),
    "entropy_target": M("algo.entropy_target: same meaning and value"),
    "max_tool_calling_iterations": M("tools.max_turns = N + 1 (rlvr counts model turns)"),
    "vllm_importance_sampling_correction": M("algo.sampler_correction (False: none)"),
    "vllm_importance_sampling_mode": M("algo.sampler_correction (the same four modes)"),
    "vllm_importance_sampling_clip_max": M("algo.sampler_correction_cap (None: .inf)"),
    "vllm_importance_sampling_clip_min": M("algo.sampler_correction_min"),
    "use_bias_correction_kl": M("algo.kl_bias_correction (on by default, as in TRL)"),
    # GRPOConfig: logging
    "log_completions": M("logging.completions_every = logging_steps (False: 0); the table goes to samples.jsonl"),
    "log_multimodal": N("rlvr trains on text"),
    "num_completions_to_print": M("logging.num_completions"),
    "log_unique_prompts": N("samples.jsonl keeps the completions with their prompts"),
    "log_completions_hub_repo": R(_HUB),
    "use_transformers_continuous_batching": N("rlvr's hf engine batches generation itself"),
    "transformers_continuous_batching_config": N("rlvr's hf engine batches generation itself"),
    "use_transformers_paged": N("rlvr's hf engine batches generation itself"),
    "vllm_importance_sampling_cap": M("algo.sampler_correction_cap (TRL's older name)"),
    "max_prompt_length": R("gone from TRL 1.x (its GRPOConfig refuses it); rlvr never cuts prompts: shorten them in the data"),
}


def table() -> list[str]:
    """Markdown rows: field, what rlvr does, how."""
    rows = ["| GRPOConfig field | rlvr | how |", "|---|---|---|"]
    return rows + [f"| `{name}` | {rule.kind.replace('_', ' ')} | {rule.what} |" for name, rule in RULES.items()]
