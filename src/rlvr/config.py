"""Typed configuration: nested dataclasses, YAML files and dotted `key=value` overrides.

Every field has a docstring (shown by `rlvr train --help-config`). Nothing here rewrites
itself: what you set is what runs; derived values are properties. `validate` collects every
problem at once and names each field.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field



class ConfigError(ValueError):
    """A configuration problem; the message names the field."""


@dataclass
class LoraConfig:
    r: int = 0
    """LoRA rank; 0 trains all weights (full fine-tune). Needs `pip install 'rlvr[lora]'` (peft)."""
    alpha: float = 16.0
    """LoRA scaling numerator (the adapter's output is scaled by alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names that get adapters (e.g. [q_proj, v_proj]); [all-linear] = every linear layer but the output head."""
    quantize: str = "none"
    """QLoRA: load the frozen base weights in `4bit` or `8bit` (bitsandbytes, CUDA only), or `none`."""
    save_merged: bool = False
    """Also write the base weights with the adapter merged in, to <output_dir>/final-merged."""


@dataclass
class ModelConfig:
    path: str = "tiny"
    """`tiny` (the model bundled with rlvr), a local folder, or a Hugging Face hub id."""
    dtype: str = "float32"
    """Dtype of the trained weights: float32, bfloat16 or float16."""
    trust_remote_code: bool = False
    """Passed to transformers when loading the model and tokenizer."""
    gguf_file: str | None = None
    """A GGUF file inside `path` to load (dequantised) into a normal trainable model."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass: less memory, about a third more compute."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA / QLoRA adapters (through peft); off while lora.r = 0."""
    autocast: str = "none"
    """`bf16`: bf16 autocast for generation and training forwards (weights and optimizer stay in `dtype`); `none`."""


@dataclass
class DistConfig:
    strategy: str = "ddp"
    """With several processes: `ddp` (every rank holds all weights) or `fsdp` (FSDP2 fully_shard: weights, gradients and optimizer state sharded, for models that do not fit one device; tested on CPU/gloo, not yet on GPU/nccl; checkpoints are written unsharded, as one process writes them, and resume under any strategy)."""
    backend: str = "auto"
    """torch.distributed backend: auto (nccl on GPU, gloo on CPU), gloo or nccl."""
    timeout: float = 900.0
    """Seconds any collective may wait for the other ranks before the job stops with an error naming the missing rank."""


@dataclass
class DataConfig:
    task: str | None = "arithmetic"
    """Built-in task generating its own prompts (`arithmetic`); set to null to use `path`."""
    path: str | None = None
    """Prompt dataset: a .jsonl/.json/.parquet/.csv file, a local `datasets` folder, or a hub id."""
    split: str = "train"
    """Split to read when `path` is a `datasets` dataset."""
    subset: str | None = None
    """The `datasets` configuration (subset) name, e.g. `main` for openai/gsm8k."""
    prompt_column: str = "prompt"
    """Column holding the prompt: plain text, or a list of chat messages."""
    system_prompt: str | None = None
    """Optional system message placed before every prompt."""
    digits: int = 2
    """arithmetic: digits per operand."""
    operators: str = "+-"
    """arithmetic: operators to draw from (any of + - *)."""
    eval_size: int = 500
    """arithmetic: size of the held-out evaluation set."""
    shuffle: bool = True
    """Shuffle file datasets, with a fresh order each epoch drawn from the run seed."""


@dataclass
class VllmConfig:
    gpu_memory_utilization: float = 0.3
    """Share of the GPU's memory vLLM may take (weights + KV cache); the rest is the trainer's (colocated)."""
    sleep: bool = True
    """GPU: release vLLM's KV cache (and weight copy) while the trainer trains, restore it before generating."""
    max_model_len: int | None = None
    """Longest prompt + completion vLLM plans its KV cache for; default: the model's context length."""
    dtype: str = "auto"
    """vLLM's weight dtype; `auto` = model.dtype. The sampler/trainer mismatch this creates is corrected by algo.sampler_correction."""
    enforce_eager: bool = False
    """Skip CUDA-graph capture / compilation (faster start-up, slower decode)."""


@dataclass
class RolloutConfig:
    engine: str = "hf"
    """Generation engine: `hf` (transformers models on CPU or GPU, no extra install) or `vllm`
    (colocated vLLM: weights synced after each update, LoRA adapters synced without merging)."""
    vllm: VllmConfig = field(default_factory=VllmConfig)
    """Settings of the `vllm` engine."""
    group_size: int = 8
    """G: completions sampled per prompt. 2 turns any difference into +1/-1; 1 gives no signal."""
    prompts_per_step: int = 32
    """Prompts per training step; the step trains on prompts_per_step x group_size completions."""
    max_new_tokens: int = 8
    """Length limit of each completion, in tokens."""
    temperature: float = 1.0
    """Sampling temperature; training log-probs use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 disables)."""
    top_k: int = 0
    """Top-k sampling (0 disables)."""
    ignore_eos: bool = False
    """Keep generating past EOS: every completion is max_new_tokens long (benchmarks, fixed-cost steps)."""

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


@dataclass
class AlgoConfig:
    loss_type: str = "dapo"
    """Loss aggregation: dapo (token mean over the batch), grpo, bnpo, dr_grpo. See docs/algorithms.md."""
    epsilon: float = 0.2
    """Clip range, low side (and high side unless epsilon_high is set)."""
    epsilon_high: float | None = None
    """Clip range, high side (DAPO clip-higher, e.g. 0.28)."""
    delta: float | None = None
    """Optional upper bound on the ratio before the min (two-sided clipping, e.g. 4.0)."""
    importance_sampling_level: str = "token"
    """`token` ratios, or `sequence` (GSPO: one ratio per completion)."""
    num_iterations: int = 1
    """mu: optimisation passes over each batch of completions."""
    beta: float = 0.0
    """KL penalty coefficient; 0 loads no reference model at all."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3."""
    scale_rewards: str = "group"
    """Advantage scaling: group (divide by the group's std), batch, or none."""
    std_ddof: int = 0
    """Degrees of freedom of that std: 0 (population, the seeds' table) or 1 (TRL's torch.std)."""
    reward_aggregation: str = "sum_then_normalize"
    """Several rewards: sum_then_normalize (weighted sum, then normalise) or normalize_then_sum."""
    mask_truncated_completions: bool = False
    """Leave completions that hit max_new_tokens without EOS out of the loss."""
    top_entropy_quantile: float = 1.0
    """Train only on this top share of tokens by entropy (1.0 = all tokens)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample fresh prompts."""
    max_resample_rounds: int = 4
    """Dynamic sampling: most extra generation rounds per step before training on what there is."""
    sampler_correction: str = "auto"
    """Importance weights for the sampler and trainer computing slightly different probabilities:
    token_truncate (TIS, min(w, cap)), token_mask (MIS, w if w <= cap else 0), none, or auto
    (token_truncate with the vllm engine; none with hf, whose sampler is the trained model itself)."""
    sampler_correction_cap: float = 3.0
    """The cap of those importance weights."""


@dataclass
class OptimConfig:
    lr: float = 3e-4
    """AdamW learning rate (the default suits the bundled tiny model; real models want ~1e-6)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.99
    """AdamW beta2."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 disables)."""
    lr_schedule: str = "constant"
    """constant, linear (decay to 0) or cosine, after warmup."""
    warmup_steps: int = 0
    """Linear warm-up, in optimizer updates."""
    micro_batch_size: int = 0
    """Completions per forward/backward (gradient accumulation); 0 = the whole step at once."""
    skip_zero_advantage: bool = True
    """Skip forward/backward of completions with advantage exactly 0 when their gradient is zero
    (beta=0, no top-entropy selection, loss_type not bnpo). Same update; entropy then comes from trained rows."""
    shared_prefix: bool = True
    """Training forward runs each group's prompt once and shares its KV cache (with gradient) across the group."""
    pack_by_length: bool = True
    """Sort completions by length into micro-batches (each trimmed to its own longest) when that computes fewer tokens; same update."""


@dataclass
class RewardConfig:
    fn: str = "arithmetic"
    """A built-in name, `module:function`, or `path/to/file.py:function` (TRL's signature)."""
    weight: float = 1.0
    """Weight of this reward in the combination."""
    name: str | None = None
    """Name in metrics (rewards/<name>/mean); defaults to the function's name."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """GRPO and its variants."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    rewards: list[RewardConfig] = field(default_factory=lambda: [RewardConfig()])
    """Reward functions, combined with their weights."""
    steps: int = 150
    """Training steps (each: generate, score, update mu times)."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    output_dir: str | None = None
    """Where metrics, samples and checkpoints go; default runs/<date-time>."""
    device: str = "auto"
    """auto (CUDA when available), cpu, or cuda."""
    threads: int = 0
    """torch CPU threads (0 leaves torch's default)."""
    nproc: int = 1
    """Processes (ranks) to train with: > 1 launches itself through torchrun, one per GPU (or CPU processes with gloo)."""
    dist: DistConfig = field(default_factory=DistConfig)
    """Multi-process training (torchrun / torch.distributed)."""
    log_completions_every: int = 10
    """Write sample completions with their rewards every N steps (0 disables)."""
    num_completions_logged: int = 8
    """How many completions each such write keeps."""
    save_every: int = 0
    """Checkpoint every N steps (0: only the final model)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk; older ones are deleted."""
    resume: str | None = None
    """A checkpoint folder to resume from, or `auto` for the newest in output_dir."""
    max_bad_steps: int = 3
    """Stop after this many steps in a row with a non-finite loss or gradient (each is skipped)."""
    eval_before_after: bool = True
    """Evaluate held-out accuracy (greedy) before and after training, when the task has a split."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Dashboards besides metrics.jsonl: any of tensorboard, wandb, trackio (each when installed), or []."""
    doctor_every: int = 10
    """Run `rlvr doctor`'s checks every N steps and print new findings as warnings (0 disables)."""

    @property
    def sampler_correction(self) -> str:
        """algo.sampler_correction with `auto` resolved for the engine in use."""
        if self.algo.sampler_correction != "auto":
            return self.algo.sampler_correction
        return "token_truncate" if self.rollout.engine == "vllm" else "none"


# ---------------------------------------------------------------------------------------------
# Validation: every problem at once, each naming its field and what to change.


def _validate_scale_out(cfg: Config, errors: list[str], choice) -> None:
    """nproc, dist.*, model.lora.* and how the batch splits across ranks (see rlvr.plan)."""
    from rlvr.plan import batch_split_errors

    lo, d = cfg.model.lora, cfg.dist
    if cfg.nproc < 1:
        errors.append(f"`nproc` must be >= 1, got {cfg.nproc}")
    else:
        errors += batch_split_errors(cfg, cfg.nproc)
    choice("dist.strategy", d.strategy, ["ddp", "fsdp"])
    choice("dist.backend", d.backend, ["auto", "gloo", "nccl"])
    if d.strategy == "fsdp" and cfg.nproc > 1 and lo.save_merged:
        errors.append("`model.lora.save_merged` is not implemented with dist.strategy=fsdp (the sharded model cannot be copied to merge): "
                      "set it to false and merge final/'s adapter afterwards (peft: PeftModel.from_pretrained(base, 'final').merge_and_unload()), or use ddp")
    if d.timeout <= 0:
        errors.append(f"`dist.timeout` must be positive (seconds), got {d.timeout}")
    if lo.r < 0:
        errors.append(f"`model.lora.r` must be >= 0 (0 = no LoRA), got {lo.r}")
    if lo.alpha <= 0:
        errors.append(f"`model.lora.alpha` must be positive, got {lo.alpha}")
    if not 0 <= lo.dropout < 1:
        errors.append(f"`model.lora.dropout` must be in [0, 1), got {lo.dropout}")
    if not lo.target_modules:
        errors.append("`model.lora.target_modules` is empty: name the modules to adapt, or [all-linear]")
    choice("model.lora.quantize", lo.quantize, ["none", "4bit", "8bit"])
    if lo.quantize != "none" and lo.r == 0:
        errors.append(f"`model.lora.quantize`={lo.quantize} freezes quantised base weights: it needs LoRA adapters, set model.lora.r (e.g. 16)")
    if lo.quantize != "none" and cfg.device == "cpu":
        errors.append(f"`model.lora.quantize`={lo.quantize} needs bitsandbytes on a CUDA GPU; set it to none on device=cpu")
    if lo.save_merged and lo.r == 0:
        errors.append("`model.lora.save_merged` needs LoRA (model.lora.r > 0)")


def validate(cfg: Config, *, force: bool = False) -> list[str]:
    """Raise ConfigError listing every invalid field; return warnings (the seeds' common mistakes)."""
    from rlvr.algo import ADVANTAGE_SCALES, IMPORTANCE_LEVELS, KL_ESTIMATORS, LOSS_AGGREGATIONS, REWARD_AGGREGATIONS, SAMPLER_CORRECTIONS

    errors, warnings = [], []

    def choice(key, value, options):
        if value not in options:
            close = difflib.get_close_matches(str(value), list(options), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            errors.append(f"`{key}` must be one of {sorted(options)}, got {value!r}{hint}")

    r, a, o = cfg.rollout, cfg.algo, cfg.optim
    if r.group_size < 2:
        errors.append(f"`rollout.group_size` must be at least 2 (got {r.group_size}): one completion per prompt has no group to compare with")
    elif r.group_size == 2:
        warnings.append("rollout.group_size=2: every difference, even grader noise, becomes a full +1/-1 advantage; 4-16 is usual")
    if r.prompts_per_step < 1:
        errors.append(f"`rollout.prompts_per_step` must be at least 1, got {r.prompts_per_step}")
    if r.max_new_tokens <= 0:
        errors.append(f"`rollout.max_new_tokens` must be positive, got {r.max_new_tokens}")
    if r.temperature < 0:
        errors.append(f"`rollout.temperature` must be >= 0, got {r.temperature}")
    elif r.temperature == 0 and not force:
        errors.append("`rollout.temperature` is 0: all G completions of a prompt would be identical (no signal); use e.g. 1.0")
    if not 0 < r.top_p <= 1:
        errors.append(f"`rollout.top_p` must be in (0, 1], got {r.top_p}")
    if r.top_k < 0:
        errors.append(f"`rollout.top_k` must be >= 0, got {r.top_k}")
    choice("rollout.engine", r.engine, ["hf", "torch", "vllm"])
    if r.engine == "vllm":
        v = r.vllm
        if not 0 < v.gpu_memory_utilization <= 1:
            errors.append(f"`rollout.vllm.gpu_memory_utilization` must be in (0, 1], got {v.gpu_memory_utilization}")
        if v.max_model_len is not None and v.max_model_len <= r.max_new_tokens:
            errors.append(f"`rollout.vllm.max_model_len`={v.max_model_len} leaves no room for prompts: it must exceed rollout.max_new_tokens={r.max_new_tokens}")
        choice("rollout.vllm.dtype", v.dtype, ["auto", "float32", "bfloat16", "float16"])
        if cfg.model.gguf_file:
            errors.append("`rollout.engine`=vllm loads a Hugging Face folder: convert the GGUF once with `rlvr convert-gguf` and point model.path at the result")
        if cfg.nproc > 1 and cfg.dist.strategy == "fsdp":
            errors.append("`rollout.engine`=vllm with dist.strategy=fsdp is not supported (each rank's vLLM needs the full weights): use ddp, or engine=hf")
    choice("algo.sampler_correction", a.sampler_correction, ["auto", "none", *SAMPLER_CORRECTIONS])
    if a.sampler_correction_cap <= 1:
        errors.append(f"`algo.sampler_correction_cap` must be > 1, got {a.sampler_correction_cap}")
    choice("algo.loss_type", a.loss_type, LOSS_AGGREGATIONS)
    choice("algo.importance_sampling_level", a.importance_sampling_level, IMPORTANCE_LEVELS)
    choice("algo.kl_estimator", a.kl_estimator, KL_ESTIMATORS)
    choice("algo.scale_rewards", a.scale_rewards, ADVANTAGE_SCALES)
    choice("algo.reward_aggregation", a.reward_aggregation, REWARD_AGGREGATIONS)
    choice("optim.lr_schedule", o.lr_schedule, ["constant", "linear", "cosine"])
    choice("model.dtype", cfg.model.dtype, ["float32", "bfloat16", "float16"])
    choice("model.autocast", cfg.model.autocast, ["bf16", "none"])
    if cfg.model.autocast == "bf16" and cfg.device != "cuda":
        from rlvr.policy import cpu_has_fast_bf16

        if not cpu_has_fast_bf16():
            warnings.append("model.autocast=bf16 on a CPU without avx512_bf16/AMX: bf16 matmuls are emulated there and usually slower than fp32")
    choice("device", cfg.device, ["auto", "cpu", "cuda"])
    if not 0 < a.epsilon < 1:
        errors.append(f"`algo.epsilon` must be in (0, 1), got {a.epsilon}")
    if a.epsilon_high is not None and a.epsilon_high <= 0:
        errors.append(f"`algo.epsilon_high` must be positive, got {a.epsilon_high}")
    if a.delta is not None and a.delta <= 1:
        errors.append(f"`algo.delta` must be > 1 (it caps the ratio), got {a.delta}")
    if a.num_iterations < 1:
        errors.append(f"`algo.num_iterations` must be >= 1, got {a.num_iterations}")
    if a.beta < 0:
        errors.append(f"`algo.beta` must be >= 0, got {a.beta}")
    if a.std_ddof not in (0, 1):
        errors.append(f"`algo.std_ddof` must be 0 or 1, got {a.std_ddof}")
    if not 0 < a.top_entropy_quantile <= 1:
        errors.append(f"`algo.top_entropy_quantile` must be in (0, 1], got {a.top_entropy_quantile}")
    if a.max_resample_rounds < 0:
        errors.append(f"`algo.max_resample_rounds` must be >= 0, got {a.max_resample_rounds}")
    if o.lr <= 0:
        errors.append(f"`optim.lr` must be positive, got {o.lr}")
    if o.max_grad_norm < 0:
        errors.append(f"`optim.max_grad_norm` must be >= 0, got {o.max_grad_norm}")
    if o.micro_batch_size < 0:
        errors.append(f"`optim.micro_batch_size` must be >= 0, got {o.micro_batch_size}")
    _validate_scale_out(cfg, errors, choice)
    if cfg.max_bad_steps < 1:
        errors.append(f"`max_bad_steps` must be >= 1, got {cfg.max_bad_steps}")
    if cfg.steps < 1:
        errors.append(f"`steps` must be >= 1, got {cfg.steps}")
    if not cfg.rewards:
        errors.append("`rewards` is empty: at least one reward function is needed")
    if cfg.data.task is None and cfg.data.path is None:
        errors.append("`data.task` and `data.path` are both empty: name a built-in task or a dataset")
    if cfg.data.task is not None:
        choice("data.task", cfg.data.task, ["arithmetic"])
    for name in cfg.report_to:
        choice("report_to", name, ["tensorboard", "wandb", "trackio", "none"])
    if cfg.doctor_every < 0:
        errors.append(f"`doctor_every` must be >= 0, got {cfg.doctor_every}")
    if r.temperature == 0 and force and r.group_size > 1:
        warnings.append("rollout.temperature=0 forced: the G completions of a prompt will be identical, so most groups give no signal")
    if a.beta == 0:
        warnings.append("no KL penalty (algo.beta=0): no reference model is loaded")
    elif cfg.model.lora.r > 0:
        warnings.append(f"KL penalty on (algo.beta={a.beta}, {a.kl_estimator} estimator): the reference is the base model with the adapter disabled (no second copy)")
    else:
        warnings.append(f"KL penalty on (algo.beta={a.beta}, {a.kl_estimator} estimator): a frozen reference model is loaded (a second copy of the weights)")
    if errors:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))
    return warnings


# Parsing lives in config_load.py; re-exported so `from rlvr.config import load_config` keeps working.
from rlvr.config_load import describe, field_docs, load_config, to_dict  # noqa: E402, F401
