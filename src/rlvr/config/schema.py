"""The configuration schema: nested dataclasses, every field with a docstring (shown by
`rlvr train --help-config`). Nothing here rewrites itself: what you set is what runs; derived
values are properties (or resolved once in rlvr.training.batch_plan)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlvr.config.algo_schema import AlgoConfig as AlgoConfig  # the `algo` section, in its own file (many settings)


class ConfigError(ValueError):
    """A configuration problem; the message names the field."""


@dataclass
class LoraConfig:
    r: int = 0
    """LoRA rank; 0 trains all weights (full fine-tune). Needs `pip install 'rlvr[lora]'` (peft)."""
    alpha: float = 16.0
    """LoRA scaling numerator (the adapter's output is scaled by alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter's input, in the training forwards only: old and reference log-probs are
    computed without it, as the sampler runs (one extra no-grad forward per step; docs/algorithms.md §6)."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names that get adapters (e.g. [q_proj, v_proj]); [all-linear] = every linear layer but the output head."""
    quantize: str = "none"
    """QLoRA: load the frozen base weights in `4bit` or `8bit` (bitsandbytes, CUDA only), or `none`."""
    save_merged: bool = False
    """Also write the base weights with the adapter merged in, to <output_dir>/final-merged."""
    merge_for_generation: bool = True
    """When generation runs in fp32, the hf engine generates with the adapter merged into the base weights (one
    product per adapted layer instead of three; training keeps them apart for the adapter's gradients): faster
    decoding, for one fp32 copy of the adapted layers' weights while generating. Log-probs differ from the unmerged
    adapter's by rounding only. Under bf16 nothing is merged: a bf16 merged weight rounds unlike the training forward
    (rlvr.models.lora_merge)."""


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
    tokenizer: str | None = None
    """The tokenizer (TRL's processing_class): a folder or hub id; unset: `path`'s own."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass: less memory, about a third more compute."""
    disable_dropout: bool = False
    """Dropout off in the policy, its reference and LoRA's adapters: every dropout module's probability and every
    `*dropout` number of the model's config and attention set to 0 (TRL's disable_dropout)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA / QLoRA adapters (through peft); off while lora.r = 0."""
    autocast: str = "auto"
    """`bf16`: bf16 autocast for generation and training forwards (weights and optimizer stay in `dtype`); `none`: no
    autocast; `auto`: whichever is faster here: on CUDA bf16 where the GPU supports it, on the CPU the faster of the
    two for one step of this model, timed at start-up (a few seconds for a ~100M model) and cached per model, machine
    and shapes in ~/.cache/rlvr/precision.json (RLVR_PRECISION_CACHE); printed at start-up with both estimates."""


@dataclass
class DistConfig:
    strategy: str = "ddp"
    (
        "With several processes: `ddp` (every rank holds all weights) or `fsdp` (FSDP2 fully_shard: weights, gradients and "
        "optimizer state sharded, for models that do not fit one device; tested on CPU/gloo, not yet on GPU/nccl; "
        "checkpoints are written unsharded, as one process writes them, and resume under any strategy)."
    )
    backend: str = "auto"
    """torch.distributed backend: auto (nccl on GPU, gloo on CPU), gloo or nccl."""
    timeout: float = 900.0
    """Seconds any collective may wait for the other ranks before the job stops with an error naming the missing rank."""


@dataclass
class DataConfig:
    task: str | None = None
    """Built-in task generating its own prompts (arithmetic, multiplication, guess_number); unset: `arithmetic`
    when `path` is unset too. Set one of `task` and `path`, not both."""
    path: str | None = None
    """Prompt dataset: a .jsonl/.json/.parquet/.csv file, a local `datasets` folder, or a hub id. Setting it trains on it."""
    split: str = "train"
    """Split to read when `path` is a `datasets` dataset."""
    subset: str | None = None
    """The `datasets` configuration (subset) name, e.g. `main` for openai/gsm8k."""
    prompt_column: str = "prompt"
    """Column holding the prompt: plain text, or a list of chat messages."""
    system_prompt: str | None = None
    """Optional system message placed before every prompt."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra variables for the tokenizer's chat template on every rendering (prompts, tool turns, agents'
    conversations), e.g. `{enable_thinking: false}` for Qwen3: TRL's chat_template_kwargs."""
    digits: int = 2
    """arithmetic: digits per operand."""
    operators: str = "+-"
    """arithmetic: operators to draw from (any of + - *)."""
    eval_size: int = 500
    """arithmetic: size of the held-out evaluation set."""
    shuffle: bool = True
    """Shuffle file datasets, with a fresh order each epoch drawn from the run seed."""

    @property
    def builtin_task(self) -> str | None:
        """The built-in task that supplies the prompts: `task`, or `arithmetic` when neither `task` nor `path` is set."""
        return self.task if self.task is not None or self.path is not None else "arithmetic"


@dataclass
class EvalConfig:
    before_after: bool = True
    """Evaluate on the held-out set (greedy) before and after training, when there is one (a built-in task, or eval.data)."""
    every: int = 0
    """Also evaluate on the held-out set every N steps, logged as `eval/reward` (0: only before and after; the last
    step's number is summary.json's eval_after)."""
    data: str | None = None
    """Held-out prompts: a .jsonl/.json/.parquet/.csv file, a `datasets` folder or hub id (as data.path). Unset: the
    built-in task's held-out split, or no held-out evaluation for a data.path run."""
    split: str = "test"
    """Split to read when `eval.data` is a `datasets` dataset."""
    subset: str | None = None
    """The `datasets` configuration (subset) name of `eval.data`."""
    prompt_column: str | None = None
    """Column of `eval.data` holding the prompt; unset: data.prompt_column."""
    reward: str | None = None
    """The reward whose mean over the held-out rows is the held-out number (accuracy for a 0/1 verifier): a built-in
    name, `module:function` or `file.py:function`. Unset: the built-in task's verifier, else rewards.0.fn, else (rewards: []
    with tools.environment) the environment's get_reward(). `all`: the training's reward functions weighted and summed
    (TRL's eval_reward), each function's mean and std logged beside it (eval/rewards/<fn>/mean)."""
    size: int = 0
    """Evaluate only the first N rows of `eval.data` (0: all of them). Built-in tasks: data.eval_size."""
    samples: int = 1
    """Episodes per held-out row: 1 is greedy (the held-out number); more are sampled at eval.temperature and add
    eval/pass@k (k = 1, 2, 4, ... up to samples; a 0/1 verifier), eval/maj@samples (a verifier that compares answers)
    and eval/avg@samples, whose mean is then the held-out number."""
    temperature: float = 1.0
    """The sampling temperature of eval.samples > 1, which samples through the training's rollout.top_p, top_k, min_p
    and repetition_penalty as well (TRL's evaluation samples with its training's settings); greedy (samples: 1) uses none."""


@dataclass
class CheckpointConfig:
    every: int = 0
    """Checkpoint every N steps (0: none between). The end of a run and a stop by SIGINT, SIGTERM or SIGHUP are checkpointed
    in any case, so a finished run continues with `--resume RUN steps=M`."""
    keep: int = 2
    """Checkpoints kept on disk; older ones are deleted (0: keep every one) but the best one (checkpoint.best_metric)."""
    best_metric: str | None = None
    """A held-out metric (eval/reward, eval/pass@4, ...; needs eval.every > 0): each evaluation that improves on it checkpoints
    its step, which checkpoint.keep never deletes; summary.json names it (TRL's metric_for_best_model)."""
    greater_is_better: bool = True
    """Whether a larger checkpoint.best_metric is better."""
    load_best_at_end: bool = False
    """final/ gets the best checkpoint's weights (the last step's stay in the newest checkpoint, which --resume reads)."""


@dataclass
class LoggingConfig:
    completions_every: int = 10
    """Write sample completions with their rewards every N steps (0 disables)."""
    num_completions: int = 8
    """How many completions each such write keeps."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Dashboards besides metrics.jsonl: any of tensorboard, wandb, trackio (each when installed), or []."""
    doctor_every: int = 10
    """Run `rlvr doctor`'s checks every N steps and print new findings as warnings (0 disables)."""


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
    min_p: float = 0.0
    """Min-p sampling: tokens less probable than min_p x the most probable one are not drawn (0 disables)."""
    repetition_penalty: float = 1.0
    """> 1 discourages the tokens already in the prompt or the completion so far: their logit divided by it where
    positive, multiplied where negative, before the temperature (transformers' and vLLM's; 1 disables); in multi-turn
    episodes the tools' tokens count too. Not with agents or rollout functions (they sample their own way)."""
    ignore_eos: bool = False
    """Keep generating past EOS: every completion is max_new_tokens long (benchmarks, fixed-cost steps)."""
    servers: list[str] = field(default_factory=list)
    """Generation servers (`rlvr serve`, engine hf or vllm) as URLs, e.g. [http://10.0.0.5:8000]: rollouts are made there,
    rows spread across them, weights pushed after every update (docs/scale-out.md). Empty: generation in this process.
    A token for servers bound beyond loopback comes from $RLVR_SERVER_TOKEN."""
    max_staleness: int = 0
    """k: the next steps' rollouts are generated while the trainer updates, from weights at most k updates older than
    the weights they train (older rows are dropped and regenerated). 0: synchronous. Without rollout.servers, k > 0
    starts a local generation process (the hf engine with its own copy of the weights)."""
    weight_sync: str = "distributed"
    """How weights reach the servers: `distributed` (torch.distributed: gloo on CPU, NCCL on GPU; the servers must reach
    rollout.trainer_host) or `filesystem` (safetensors in rollout.weight_dir, a folder the servers also see)."""
    weight_dir: str | None = None
    """weight_sync=filesystem: the shared folder the weights are written to (each version in its own subfolder)."""
    trainer_host: str | None = None
    """The address the servers reach this trainer's rank 0 at for weight sync (default: 127.0.0.1 when every server is
    on loopback, else this host's name)."""
    server_timeout_s: float = 600.0
    """Seconds a server may take to answer a request (or a sync) before it is dropped and its rows regenerated elsewhere."""
    agent: str | None = None
    """An agent that runs each episode itself against an OpenAI-compatible endpoint of the policy: `file.py:fn` or
    `module:fn`, called as fn(row, base_url, model, api_key) (sync or async) -> a reward, or None to let `rewards`
    score its final messages; any client works (the `openai` package, agent frameworks). See docs/agents.md."""
    agent_timeout: float = 300.0
    """Seconds an agent's episode may run; one still running then gets no reward and no gradient (counted)."""
    function: str | None = None
    """A rollout function that makes the episodes itself (TRL's `rollout_func`): `file.py:function` or
    `module:function`, called as fn(prompts, model=, tokenizer=, sampling=, seeds=); see docs/agents.md."""
    compile: str = "off"
    """`on`: the hf engine's single-turn decode step of Llama-family models runs its layers under torch.compile on the
    CPU (one graph per KV layout for the whole run; products from the same packed weights, only the elementwise
    work rounds differently). 0.79-1.19x the speed of eager bf16 generation on 9-76M models (1.00x and 0.79x on an
    AMX Xeon), about 1.0x in fp32, after 22-58 s of compiling at the first step (bench/results/floor_decode_compile.md,
    floor_decode_compile_amx.md): off by default."""

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def reshapes_distribution(self) -> bool:
        """The sampler draws from other than the model's distribution at the temperature (top-k, top-p, min-p, a
        repetition penalty): its log-probs are not the policy's."""
        return self.top_k != 0 or self.top_p < 1.0 or self.min_p > 0 or self.repetition_penalty != 1


@dataclass
class ToolsConfig:
    functions: list[str] = field(default_factory=list)
    """Tools the model may call (TRL's `tools`): built-in names (calculator, python), `module:function` or
    `file.py:function`; functions with type hints and a Google docstring, sync or async. Empty: no tools."""
    environment: str | None = None
    """An environment (TRL's `environment_factory`): a built-in name (guess_number), `file.py:Class` or
    `module:Class`; one instance per episode, `reset(**row)`, public methods as tools, optional `get_reward()`."""
    format: str = "auto"
    """How the model calls tools: `tags` (<calc>12*34</calc> answered by <result>408</result>), `chat_template`
    (the tokenizer's tool template, Hermes/Qwen <tool_call>{json}</tool_call>, results as role: tool messages;
    refused for a template that cannot render tools=), or `auto` (chat_template when the template renders tools=,
    else tags; the choice and why is printed at start)."""
    tags: list[str] = field(default_factory=list)
    """tags format: `tool=tag` pairs, e.g. [calculator=calc]; a tool without one uses its own name as tag."""
    result_tags: list[str] = field(default_factory=lambda: ["<result>", "</result>"])
    """tags format: the opening and closing text around each tool result."""
    describe: bool = True
    """tags format: describe the tools in the system prompt (each tool's JSON schema, as chat templates show
    tools=, and its tag call), after data.system_prompt; false for a model trained on the tags without it."""
    max_turns: int = 4
    """Most model turns per episode; a call made in the last one is not run."""
    timeout_s: float = 10.0
    """Each tool call's time limit; a call still running then becomes an error message the model sees."""
    max_result_chars: int = 1000
    """Longer tool results are cut (with a marker saying so)."""

    @property
    def enabled(self) -> bool:
        return bool(self.functions) or self.environment is not None


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
    eps: float = 1e-8
    """AdamW epsilon (TRL's adam_epsilon)."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 disables)."""
    lr_schedule: str = "constant"
    """constant, linear (decay to 0) or cosine (down to optim.min_lr_rate x optim.lr), after warmup."""
    min_lr_rate: float = 0.0
    """cosine: the rate it ends at, as a share of optim.lr (transformers' cosine_with_min_lr, e.g. 0.1)."""
    warmup_steps: int = 0
    """Linear warm-up, in optimizer updates."""
    warmup_from_zero: bool = False
    """The warm-up's first update at rate 0, update u at u / warmup_steps, as transformers' schedules (TRL's); false:
    update u at (u + 1) / warmup_steps, so that no update is wasted."""
    micro_batch_size: int = 0
    """Completions per forward/backward (gradient accumulation); 0, or more than an update has (per rank): all of them at once."""
    steps_per_generation: int = 1
    """Optimizer steps per generated batch (per pass): the batch is split into this many minibatches of whole
    groups, each its own optimizer step; old log-probs stay the generating policy's (TRL's steps_per_generation,
    counted in optimizer steps; verl's ppo_mini_batch_size)."""
    skip_zero_advantage: bool = True
    """Skip forward/backward of completions with advantage exactly 0 when their gradient is zero
    (beta=0, no top-entropy selection, loss_type not bnpo). Same update; `entropy` still counts every sampled token."""
    shared_prefix: bool = True
    """Training forward runs each group's prompt once and shares its KV cache (with gradient) across the group."""
    pack_by_length: bool = True
    """Sort completions by length into micro-batches (each trimmed to its own longest) when that computes fewer tokens; same update."""
    compile: str = "auto"
    """torch.compile the training forward+backward: `on`, `off`, or `auto` (on where measured to win within a run's
    first steps: nowhere yet, see bench/results/compile.md; each bucket's first compile takes a while). Lengths are padded to buckets
    (multiples of 16, then 4 per doubling) with masked tokens, so a run compiles once per bucket it meets; same
    update. Single process; the shared-prefix forward is then off. `compile/count` and `time/compile` in the metrics."""


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
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    """Multi-turn episodes: tools the model may call, or an environment it acts in."""
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
    keep_cpu_memory: bool = True
    """Training on the CPU (Linux, glibc): keep freed memory in the process for the next tensor instead of giving
    it back to the system, which made the update's large tensors page-fault in anew at every micro-batch (an fp32
    multiply of 32 MiB tensors: 12.4 ms instead of 2.3 ms; the update 21-28 % longer on a 25M and a 76M model).
    Peak memory measured the same; memory freed during the run returns when the process ends. Process-wide:
    false leaves malloc as it is."""
    flush_denormals: bool = True
    """On the CPU, subnormal floats (below 1.2e-38 in fp32) are flushed to zero while the trainer updates the policy
    (its forwards, backward and optimizer step), in its thread and the threads its ops run on: x86 CPUs take a slow
    path for each operation that meets one, and the lm_head's backward products meet them by the million (the
    logits' gradient's tiny entries, whose products underflow) once tokens' probabilities near fp32's floor
    (bench/results/denormals_intel.md). A change below 1.2e-38 per value; false keeps them. Generation is left as
    it is."""
    nproc: int = 1
    """Processes (ranks) to train with: > 1 launches itself through torchrun, one per GPU (or CPU processes with gloo)."""
    dist: DistConfig = field(default_factory=DistConfig)
    """Multi-process training (torchrun / torch.distributed)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation (greedy), when and on what: a built-in task's own split, or `eval.data` with `eval.reward`."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """When checkpoints are written and how many are kept."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Sample completions, dashboards and the doctor's checks during training."""
    resume: str | None = None
    """A checkpoint folder to resume from, or `auto` for the newest in output_dir. `rlvr train --resume RUN_DIR`
    resumes a run with its own config.yaml (overrides allowed where they do not change the math)."""
    max_bad_steps: int = 3
    """Stop after this many steps in a row with a non-finite loss or gradient (each is skipped)."""
    max_failed_reward_steps: int = 3
    """Stop after this many steps in a row in which one reward function failed (raised, timed out, returned
    garbage) on every sample, naming it and its first error; no checkpoint is saved meanwhile (0: never stop)."""
