"""TRL's names for GRPO settings (GRPOConfig, the TrainingArguments fields a GRPO user sets,
GRPOTrainer's arguments and the `trl` CLI's model/script arguments, as of TRL 1.16) and what
rlvr calls them. A config key that is a TRL name is refused with the rlvr name as its hint (not a
did-you-mean on spelling, and never accepted as an alias: what runs is what the config says);
`rlvr train --help-config` and docs/config.md print the table."""

from __future__ import annotations

from typing import NamedTuple


class TrlName(NamedTuple):
    where: str  # which TRL object defines it
    rlvr: str | None  # the rlvr key (same meaning and value), a `key=value` setting, or None: no equivalent
    note: str = ""  # how the two differ, or why rlvr has none


_G, _T, _R, _C = "GRPOConfig", "TrainingArguments", "GRPOTrainer", "trl CLI"
_T4 = "TrainingArguments (transformers 4)"

_ALGO_SAME = (
    "beta",
    "num_iterations",
    "epsilon",
    "epsilon_high",
    "delta",
    "importance_sampling_level",
    "loss_type",
    "scale_rewards",
    "mask_truncated_completions",
    "top_entropy_quantile",
    "entropy_coef",
    "off_policy_mask_threshold",
    "sapo_temperature_pos",
    "sapo_temperature_neg",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
)
_SERVER = "TRL's vLLM server is rlvr's generation server: `rlvr serve MODEL --engine vllm`, listed in rollout.servers"
_NO_HUB = "rlvr writes the trained model to <output_dir>/final/; upload that folder yourself (huggingface_hub's upload_folder)"

TRL_NAMES: dict[str, TrlName] = {
    # GRPOConfig: generation
    "num_generations": TrlName(_G, "rollout.group_size", "completions sampled per prompt"),
    "max_completion_length": TrlName(_G, "rollout.max_new_tokens"),
    "temperature": TrlName(_G, "rollout.temperature"),
    "top_p": TrlName(_G, "rollout.top_p"),
    "top_k": TrlName(_G, "rollout.top_k"),
    "generation_batch_size": TrlName(_G, "rollout.prompts_per_step", "rlvr counts prompts: generation_batch_size / num_generations"),
    "steps_per_generation": TrlName(
        _G, "optim.steps_per_generation", "counted in optimizer steps: TRL's value / gradient_accumulation_steps"
    ),
    "num_generations_eval": TrlName(
        _G, "eval.samples", "sampled at eval.temperature through rollout's filters (1: greedy); adds eval/pass@k, maj@k, avg@k"
    ),
    "min_p": TrlName(_G, "rollout.min_p"),
    "repetition_penalty": TrlName(_G, "rollout.repetition_penalty"),
    "generation_kwargs": TrlName(_G, None, "its keys temperature, top_p, top_k, min_p, repetition_penalty are rollout.<key>"),
    "cache_implementation": TrlName(_G, None, "the hf engine manages its own KV cache"),
    "chat_template_kwargs": TrlName(_G, "data.chat_template_kwargs"),
    "max_prompt_length": TrlName(_G, None, "(gone from TRL 1.x too) prompts are never cut; shorten them in the data"),
    "shuffle_dataset": TrlName(_G, "data.shuffle"),
    "remove_unused_columns": TrlName(_G, None, "every column of a row always reaches the reward functions"),
    "pad_to_multiple_of": TrlName(_G, None, "optim.compile pads lengths to its own buckets; nothing else pads"),
    "max_tool_calling_iterations": TrlName(
        _G, "tools.max_turns", "rlvr counts model turns: N tool-calling rounds then an answer is max_turns=N+1"
    ),
    # GRPOConfig: vLLM
    "use_vllm": TrlName(_G, "rollout.engine=vllm"),
    "vllm_mode": TrlName(_G, "rollout.engine=vllm", "vllm_mode=colocate; server: rollout.servers (" + _SERVER + ")"),
    "vllm_gpu_memory_utilization": TrlName(_G, "rollout.vllm.gpu_memory_utilization"),
    "vllm_max_model_length": TrlName(_G, "rollout.vllm.max_model_len"),
    "vllm_enable_sleep_mode": TrlName(_G, "rollout.vllm.sleep", "on by default in rlvr"),
    "vllm_tensor_parallel_size": TrlName(_G, None, "each rank's vLLM holds the whole model (tensor parallel size 1)"),
    "vllm_model_impl": TrlName(_G, None, "vLLM's own model implementation is used"),
    "vllm_structured_outputs_regex": TrlName(_G, None, "generation is not constrained"),
    **{name: TrlName(_G, "rollout.servers", _SERVER) for name in ("vllm_server_base_url", "vllm_server_host", "vllm_server_port")},
    "vllm_server_timeout": TrlName(_G, "rollout.server_timeout_s"),
    "vllm_group_port": TrlName(_G, None, "the weight-sync group picks a free port and tells the server"),
    "vllm_importance_sampling_correction": TrlName(_G, "algo.sampler_correction", "none turns it off; auto corrects with the vllm engine"),
    "vllm_importance_sampling_mode": TrlName(_G, "algo.sampler_correction", "token_truncate, token_mask, sequence_truncate, sequence_mask"),
    "vllm_importance_sampling_clip_max": TrlName(_G, "algo.sampler_correction_cap"),
    "vllm_importance_sampling_clip_min": TrlName(_G, "algo.sampler_correction_min"),
    "vllm_importance_sampling_cap": TrlName(_G, "algo.sampler_correction_cap"),
    "use_transformers_continuous_batching": TrlName(_G, None, "the engines are rollout.engine=hf (batched generate) and vllm"),
    "transformers_continuous_batching_config": TrlName(_G, None, "the engines are rollout.engine=hf (batched generate) and vllm"),
    "use_transformers_paged": TrlName(_G, None, "the engines are rollout.engine=hf (batched generate) and vllm"),
    # GRPOConfig: the loss
    **{name: TrlName(_G, f"algo.{name}") for name in _ALGO_SAME},
    "multi_objective_aggregation": TrlName(_G, "algo.reward_aggregation"),
    "reward_weights": TrlName(_G, "rewards.N.weight", "one weight on each entry of `rewards`"),
    "use_bias_correction_kl": TrlName(_G, "algo.kl_bias_correction", "off by default in rlvr, on in TRL"),
    "sync_ref_model": TrlName(_G, "algo.ref_sync_steps", "sync_ref_model=True, ref_model_sync_steps=N is algo.ref_sync_steps=N"),
    "ref_model_mixup_alpha": TrlName(_G, "algo.ref_sync_alpha"),
    "ref_model_sync_steps": TrlName(_G, "algo.ref_sync_steps"),
    "use_adaptive_entropy": TrlName(_G, "algo.adaptive_entropy"),
    "entropy_target": TrlName(_G, "algo.entropy_target"),
    "entropy_coef_delta": TrlName(_G, "algo.entropy_coef_delta"),
    "entropy_coef_min": TrlName(_G, "algo.entropy_coef_min"),
    "entropy_coef_max": TrlName(_G, "algo.entropy_coef_max"),
    # GRPOConfig: the model
    "model_init_kwargs": TrlName(_G, None, "the loading options are model.dtype, model.trust_remote_code and model.gguf_file"),
    "trust_remote_code": TrlName(_G, "model.trust_remote_code"),
    "disable_dropout": TrlName(_G, "model.disable_dropout"),
    "cast_lm_head_to_fp32": TrlName(_G, None, "the output head runs in model.dtype (or under model.autocast)"),
    "router_aux_loss_coef": TrlName(_G, None, "no MoE auxiliary loss is added"),
    "ds3_gather_for_generation": TrlName(_G, None, "no DeepSpeed; dist.strategy=fsdp shards a model that does not fit one device"),
    "use_liger_kernel": TrlName(_G, None, "the model's own transformers layers run (TRL deprecates it too)"),
    "torch_empty_cache_steps": TrlName(_G, None, "the vllm engine frees its memory while training (rollout.vllm.sleep)"),
    # GRPOConfig: logging
    "log_completions": TrlName(_G, "logging.completions_every", "every N steps, to samples.jsonl (0: off)"),
    "num_completions_to_print": TrlName(_G, "logging.num_completions"),
    "log_unique_prompts": TrlName(_G, None, "samples.jsonl keeps logging.num_completions completions with their prompts"),
    "log_multimodal": TrlName(_G, None, "rlvr trains on text only"),
    "log_completions_hub_repo": TrlName(_G, None, _NO_HUB),
    # TrainingArguments
    "learning_rate": TrlName(_T, "optim.lr", "TRL's GRPO default is 1e-6; rlvr's 3e-4 suits the bundled tiny model"),
    "lr_scheduler_type": TrlName(
        _T, "optim.lr_schedule", "constant, linear or cosine; rlvr's default is constant, TrainingArguments' linear"
    ),
    "lr_scheduler_kwargs": TrlName(_T, "optim.min_lr_rate", "cosine_with_min_lr's min_lr_rate (lr_schedule=cosine)"),
    "warmup_steps": TrlName(_T, "optim.warmup_steps", "a whole number of optimizer updates (no fraction-of-training form)"),
    "warmup_ratio": TrlName(
        _T4, "optim.warmup_steps", "in optimizer updates: ratio x steps x algo.num_iterations x optim.steps_per_generation"
    ),
    "weight_decay": TrlName(_T, "optim.weight_decay"),
    "max_grad_norm": TrlName(_T, "optim.max_grad_norm"),
    "adam_beta1": TrlName(_T, "optim.beta1"),
    "adam_beta2": TrlName(_T, "optim.beta2"),
    "adam_epsilon": TrlName(_T, "optim.eps"),
    "optim": TrlName(_T, None, "the optimizer is always AdamW; rlvr's `optim` section holds its settings (optim.lr, optim.beta1, ...)"),
    "per_device_train_batch_size": TrlName(
        _T,
        "optim.micro_batch_size",
        "completions per forward/backward; a step trains on rollout.prompts_per_step x rollout.group_size completions",
    ),
    "gradient_accumulation_steps": TrlName(
        _T,
        None,
        "a step's completions are split into micro-batches of optim.micro_batch_size and accumulated into one update by themselves",
    ),
    "auto_find_batch_size": TrlName(_T, None, "TRL refuses it for GRPO too; lower optim.micro_batch_size"),
    "per_device_eval_batch_size": TrlName(_T, None, "held-out evaluation batches itself"),
    "num_train_epochs": TrlName(_T, "steps", "rlvr counts steps: one pass over N rows is N / rollout.prompts_per_step steps"),
    "max_steps": TrlName(_T, "steps"),
    "seed": TrlName(_T, "seed"),
    "output_dir": TrlName(_T, "output_dir", "default runs/<date-time>"),
    "report_to": TrlName(_T, "logging.report_to"),
    "logging_steps": TrlName(_T, None, "every step is logged (console, metrics.jsonl, logging.report_to)"),
    "logging_dir": TrlName(_T4, None, "TensorBoard logs go to output_dir"),
    "save_steps": TrlName(_T, "checkpoint.every"),
    "save_strategy": TrlName(_T, "checkpoint.every", "a checkpoint every N steps (0: only the final model)"),
    "save_total_limit": TrlName(_T, "checkpoint.keep"),
    "resume_from_checkpoint": TrlName(_T, "resume", "or `rlvr train --resume RUN_DIR`"),
    "eval_strategy": TrlName(_T, "eval.every", "every N steps (0: before and after training only, eval.before_after)"),
    "eval_steps": TrlName(_T, "eval.every"),
    "eval_on_start": TrlName(_T, "eval.before_after"),
    "do_eval": TrlName(_T, "eval.before_after"),
    "bf16": TrlName(_T, "model.autocast=bf16", "bf16 autocast over float32 weights (model.dtype)"),
    "fp16": TrlName(_T, None, "no fp16 autocast: model.autocast=bf16, or model.dtype=float16 for fp16 weights"),
    "tf32": TrlName(_T, None, "torch's default matmul precision applies"),
    "gradient_checkpointing": TrlName(_T, "model.gradient_checkpointing", "off by default in rlvr, on in TRL"),
    "torch_compile": TrlName(_T, "optim.compile=on"),
    "use_cpu": TrlName(_T, "device=cpu"),
    "ddp_backend": TrlName(_T, "dist.backend"),
    "ddp_timeout": TrlName(_T, "dist.timeout"),
    "fsdp": TrlName(_T, "dist.strategy=fsdp"),
    "deepspeed": TrlName(_T, None, "no DeepSpeed; dist.strategy=fsdp shards weights, gradients and optimizer state"),
    "run_name": TrlName(_T, None, "a run is named by its output_dir"),
    "data_seed": TrlName(_T, None, "`seed` also draws the data order"),
    "push_to_hub": TrlName(_T, None, _NO_HUB),
    "hub_model_id": TrlName(_T, None, _NO_HUB),
    "load_best_model_at_end": TrlName(_T, "checkpoint.load_best_at_end", "final/ gets the best checkpoint's weights"),
    "metric_for_best_model": TrlName(_T, "checkpoint.best_metric", "a held-out metric: eval/reward, eval/pass@4, ..."),
    "greater_is_better": TrlName(_T, "checkpoint.greater_is_better"),
    # GRPOTrainer's arguments
    "model": TrlName(_R, "model.path", "rlvr's `model` is a section: the model itself is model.path"),
    "reward_funcs": TrlName(_R, "rewards", "a list of entries with fn (and weight), e.g. rewards: [math, my.py:fn]"),
    "train_dataset": TrlName(_R, "data.path"),
    "eval_dataset": TrlName(_R, "eval.data"),
    "processing_class": TrlName(_R, "model.tokenizer", "a folder or hub id (rlvr.GRPOTrainer also takes the tokenizer object)"),
    "peft_config": TrlName(_R, "model.lora.r", "LoRA is on while model.lora.r > 0; the rest is model.lora.*"),
    "rollout_func": TrlName(_R, "rollout.function"),
    "tools": TrlName(_R, "tools.functions", "rlvr's `tools` is a section: the tool list is tools.functions"),
    "environment_factory": TrlName(_R, "tools.environment"),
    # the trl CLI's ModelConfig and ScriptArguments
    "model_name_or_path": TrlName(_C, "model.path"),
    "model_revision": TrlName(_C, None, "give a local folder, or the hub id's main revision is used"),
    "dtype": TrlName(_C, "model.dtype"),
    "torch_dtype": TrlName(_C + " (before dtype)", "model.dtype"),
    "attn_implementation": TrlName(_C, None, "transformers' default attention (SDPA) is used"),
    "use_peft": TrlName(_C, "model.lora.r", "LoRA is on while model.lora.r > 0 (e.g. 16)"),
    "lora_r": TrlName(_C, "model.lora.r"),
    "lora_alpha": TrlName(_C, "model.lora.alpha"),
    "lora_dropout": TrlName(_C, "model.lora.dropout"),
    "lora_target_modules": TrlName(_C, "model.lora.target_modules"),
    "load_in_4bit": TrlName(_C, "model.lora.quantize=4bit"),
    "load_in_8bit": TrlName(_C, "model.lora.quantize=8bit"),
    "dataset_name": TrlName(_C, "data.path"),
    "dataset_config": TrlName(_C, "data.subset"),
    "dataset_train_split": TrlName(_C, "data.split"),
    "dataset_test_split": TrlName(_C, "eval.split", "with eval.data set to the same dataset"),
}


def trl_hint(name: str) -> str | None:
    """`TRL's `x` is rlvr's `y`` (with how they differ), or that rlvr has none and why; None when
    `name` is not a TRL setting."""
    entry = TRL_NAMES.get(name)
    if entry is None:
        return None
    if entry.rlvr is None:
        return f"TRL's `{name}` has no rlvr equivalent: {entry.note}"
    return f"TRL's `{name}` is rlvr's `{entry.rlvr}`" + (f" ({entry.note})" if entry.note else "")


def trl_table(markdown: bool = False) -> list[str]:
    """The TRL -> rlvr table, one line per name: plain text grouped by where TRL defines the name
    (for --help-config), or Markdown rows (docs/config.md)."""
    if markdown:
        rows = ["| TRL | in | rlvr | note |", "|---|---|---|---|"]
        return rows + [f"| `{n}` | {e.where} | {f'`{e.rlvr}`' if e.rlvr else '(none)'} | {e.note} |" for n, e in TRL_NAMES.items()]
    lines, width = [], 36
    for where in dict.fromkeys(e.where.split(" (")[0] for e in TRL_NAMES.values()):
        lines.append(f"{where}:")
        for n, e in TRL_NAMES.items():
            if e.where.split(" (")[0] == where:
                lines.append(f"  {n:<{width}} {e.rlvr or '(none)'}" + (f"  -- {e.note}" if e.note else ""))
    return lines
