"""Checking a config against everything rlvr provides, before any compute is spent, and
resolving what depends on the machine: the device, the precision, the training prompts, the columns
the rollout gives reward functions.

rlvr.config validates fields alone (it imports nothing above it); the valid names of settings
that other packages define (loss types, objectives, estimators, engines, tasks) come from their
registries here, and so do the warnings that need the machine (bf16 on this CPU). `run_precision`
resolves model.autocast once the model is loaded.
"""

from __future__ import annotations

import os

import torch

from rlvr import algo
from rlvr.config import Config, validate
from rlvr.config.no_effect import changed
from rlvr.data import PromptStream, load_rows, render_prompt
from rlvr.dist import Dist
from rlvr.models.cpu_memory import keep_freed_memory
from rlvr.models.precision import cpu_has_fast_bf16
from rlvr.models.precision_choice import PrecisionChoice, choose_precision
from rlvr.models.precision_timing import StepShapes
from rlvr.rollout.engines import ENGINES
from rlvr.rollout.sources.function import FunctionSource
from rlvr.tasks import Task, get_task, training_tasks
from rlvr.training.batch_plan import BatchPlan


def registered_choices() -> dict[str, list[str]]:
    """The valid values of every setting in rlvr.config.REGISTERED, from the registries that define them."""
    return {
        "algo.loss_type": list(algo.LOSS_TYPES),
        "algo.importance_sampling_level": list(algo.IMPORTANCE_LEVELS),
        "algo.kl_estimator": list(algo.KL_ESTIMATORS),
        "algo.scale_rewards": list(algo.ADVANTAGE_SCALES),
        "algo.reward_aggregation": list(algo.REWARD_AGGREGATIONS),
        "algo.sampler_correction": list(algo.SAMPLER_CORRECTIONS),
        "rollout.engine": list(ENGINES),
        "data.task": training_tasks(),
    }


def unused_objective_settings(cfg: Config) -> list[str]:
    """Changed hyperparameters of objectives that algo.loss_type does not use (sapo_* with dapo, epsilon with vespo, ...)."""
    users: dict[str, list[str]] = {}
    for loss_type, (objective, _) in algo.LOSS_TYPES.items():
        for name in algo.OBJECTIVES[objective].hyperparameters:
            users.setdefault(name, []).append(loss_type)
    used = algo.OBJECTIVES[algo.LOSS_TYPES[cfg.algo.loss_type].objective].hyperparameters
    names = [n for n in users if hasattr(cfg.algo, n) and n not in used]
    return [
        f"algo.{n}={getattr(cfg.algo, n)} has no effect: algo.loss_type={cfg.algo.loss_type} does not use it "
        f"(used by: {', '.join(users[n])})"
        for n in changed(cfg.algo, names)
    ]


def check_config(cfg: Config, *, force: bool = False) -> list[str]:
    """Raise ConfigError naming every invalid setting; return the warnings to print."""
    warnings = validate(cfg, choices=registered_choices(), force=force)
    if cfg.algo.loss_type in algo.LOSS_TYPES:
        warnings += unused_objective_settings(cfg)
    if cfg.model.autocast == "bf16" and cfg.device != "cuda" and not cpu_has_fast_bf16():
        warnings.append(
            "model.autocast=bf16 on a CPU without avx512_bf16/AMX: bf16 matmuls are emulated there and usually slower than fp32"
        )
    return warnings


def plan_warnings(cfg: Config, plan: BatchPlan) -> list[str]:
    """What the batch plan turns off that the user may not expect: under optim.compile the shared-prefix forward, so
    each row runs its own copy of the prompt (bench/results/microbatch_compile_intel.md: 5.6x eager's time on config F)."""
    if not (plan.compiled_forward and cfg.optim.shared_prefix and plan.group_size > 1 and not plan.gradient_checkpointing):
        return []
    P, C, G = plan.seq_len - plan.completion_len, plan.completion_len, plan.group_size
    ratio = G * (P + C) / (P + G * C)  # tokens of a group forward+backward: each row with its prompt / the prompt once
    if ratio < 1.5:
        return []
    return [
        f"optim.compile={cfg.optim.compile} turns the shared-prefix forward off: each of a group's {G} completions runs its own "
        f"copy of the ~{P}-token prompt, about {ratio:.1f}x the tokens per update (set optim.compile=off to keep it)"
    ]


def prompt_tokens(row: dict, tokenizer, system_prompt: str | None) -> int:
    """Tokens of a training row's prompt as the model sees it (the plan's and the precision timing's prompt length)."""
    return len(tokenizer(render_prompt(row["prompt"], tokenizer, system_prompt), add_special_tokens=False)["input_ids"])


def run_precision(cfg: Config, plan: BatchPlan, model, device: torch.device, dist: Dist) -> PrecisionChoice:
    """model.autocast resolved for the run (`auto` timed on rank 0 at this rank's step shapes;
    rlvr.models.precision_choice); every rank takes rank 0's choice. Before the model is wrapped:
    the timing runs forward+backward passes on this rank alone."""
    rows = plan.completions_per_rank
    shapes = StepShapes(
        rows_per_backward=min(plan.micro_batch_size, rows),
        trained_rows=rows * cfg.algo.num_iterations,
        prompt_tokens=plan.seq_len - plan.completion_len,
        completion_tokens=plan.completion_len,
        decoded_rows=0 if cfg.rollout.engine == "vllm" else rows,
    )  # vLLM decodes in its own dtype
    choice = choose_precision(cfg.model.autocast, model, device, shapes) if dist.is_main else None
    return dist.all_gather_object(choice, what="model.autocast")[0]


def device_for(name: str) -> torch.device:
    """`auto`: CUDA when available (under torchrun, this process's LOCAL_RANK GPU), else CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and "LOCAL_RANK" in os.environ:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def run_device(cfg: Config) -> torch.device:
    """The device this process trains on; on the CPU, with cfg.keep_cpu_memory, freed memory is kept in the process
    from now on (rlvr.models.cpu_memory: large tensors would otherwise page-fault in anew at every allocation)."""
    device = device_for(cfg.device)
    if device.type == "cpu" and cfg.keep_cpu_memory:
        keep_freed_memory()
    return device


def training_prompts(cfg: Config) -> tuple[Task | None, PromptStream]:
    """(the built-in task or None, the stream of training rows)."""
    d = cfg.data
    if d.builtin_task:
        task = get_task(d.builtin_task, seed=cfg.seed, digits=d.digits, operators=d.operators, eval_size=d.eval_size)
        assert task.train_row is not None, "validation: data.task names only tasks with training rows"
        return task, PromptStream(task.train_row, None, seed=cfg.seed)
    assert d.path is not None, "no built-in task: data.path is set"
    rows = load_rows(d.path, prompt_column=d.prompt_column, split=d.split, subset=d.subset)
    return None, PromptStream.from_rows(rows, seed=cfg.seed, shuffle=d.shuffle)


def columns_the_rollout_adds(cfg: Config, source) -> frozenset[str] | None:
    """Columns the rollout gives reward functions besides the dataset's (None: unknown until it has run). `source`
    None: the config's own source, the one held-out evaluation always runs (Trainer.evaluate)."""
    if source is not None:
        return getattr(source, "reward_columns", frozenset())
    if cfg.rollout.function:
        return FunctionSource.reward_columns
    return frozenset({"environments"}) if cfg.tools.environment else frozenset()  # TRL's: the episodes' environment instances


def make_optimizer(model, cfg: Config) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters, and its learning-rate schedule over every optimizer step of the run."""
    from rlvr.training.run_control import lr_lambda

    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    # torch's fused kernel (one pass per tensor, not a dozen ops), as transformers' Trainer (and so TRL) runs it by default
    # with torch >= 2.8: one step over a 25M model's weights 9-13 ms instead of 53 (2-core AMD EPYC); not for parameters
    # of a tensor subclass (FSDP2's sharded ones), which keep torch's default implementation
    fused = bool(params) and all(
        type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params
    )
    betas, fused_or_not = (o.beta1, o.beta2), True if fused else None
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=betas, eps=o.eps, weight_decay=o.weight_decay, fused=fused_or_not)
    total = cfg.steps * cfg.algo.num_iterations * o.steps_per_generation
    schedule = lr_lambda(o.lr_schedule, o.warmup_steps, total, min_lr_rate=o.min_lr_rate, warmup_from_zero=o.warmup_from_zero)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def training_sampling(cfg: Config):
    """The sampling of training rollouts (rollout.*)."""
    from rlvr.rollout import SamplingParams

    r = cfg.rollout
    return SamplingParams(
        n=r.group_size,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        min_p=r.min_p,
        repetition_penalty=r.repetition_penalty,
        max_new_tokens=r.max_new_tokens,
        ignore_eos=r.ignore_eos,
    )


def held_out_sampling(cfg: Config, max_new_tokens: int):
    """The held-out evaluation's sampling: greedy with eval.samples=1 (the model's own choice, no filter or penalty);
    else eval.samples episodes per row at eval.temperature through the training's top_p, top_k, min_p and
    repetition_penalty (rollout.*), as TRL's evaluation samples with its training's settings."""
    import dataclasses

    from rlvr.rollout import SamplingParams

    e = cfg.eval
    if e.samples == 1:
        return SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens)
    sampled = dict(n=e.samples, temperature=e.temperature, max_new_tokens=max_new_tokens, ignore_eos=False)
    return dataclasses.replace(training_sampling(cfg), **sampled)


def schedule_change(cfg: Config, resumed_from, step: int) -> list[str]:
    """A warning when a resume changes `steps` under a learning-rate schedule laid out for the old number."""
    import yaml

    planned = yaml.safe_load((resumed_from / "config.yaml").read_text()).get("steps")
    if planned == cfg.steps or cfg.optim.lr_schedule == "constant":
        return []
    return [
        f"optim.lr_schedule={cfg.optim.lr_schedule} was laid out for {planned} steps; from step {step + 1} it follows the "
        f"one for steps={cfg.steps}, so the learning rates differ from a straight run of that length"
    ]
