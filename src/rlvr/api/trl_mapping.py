"""A TRL GRPOConfig as rlvr config settings: `settings(args, ...)` returns the dotted keys and values (TRL's
meaning, rlvr's names) and the notes to print; a field rlvr cannot honour is refused, all of them in one
ConfigError that names each. rlvr.api.trl_fields says what happens to every field; this is the arithmetic.

TRL counts optimizer steps (max_steps, save_steps, eval_steps, logging_steps); rlvr counts steps, each one
generation followed by `optimizer steps per generation x num_iterations` optimizer steps.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import Any

from rlvr.api.trl_config import GRPOConfig, trl_defaults
from rlvr.api.trl_fields import RULES
from rlvr.config import ConfigError

SCHEDULES = {
    "linear": "linear",
    "cosine": "cosine",
    "cosine_with_min_lr": "cosine",  # with optim.min_lr_rate from lr_scheduler_kwargs
    "constant": "constant",
    "constant_with_warmup": "constant",
}
ADAMW = ("adamw_torch", "adamw_torch_fused", "adamw_hf")
DASHBOARDS = ("tensorboard", "wandb", "trackio")


@dataclass
class Batches:
    """TRL's batch arithmetic (per process: per_device_train_batch_size; all: x world size)."""

    prompts_per_step: int  # prompts per generation
    group_size: int
    optimizer_steps_per_generation: int  # rlvr's optim.steps_per_generation
    updates_per_step: int  # optimizer steps per rlvr step: the above x num_iterations

    def steps(self, optimizer_steps: float) -> int:
        """rlvr steps covering TRL's count of optimizer steps."""
        return max(1, math.ceil(optimizer_steps / self.updates_per_step))


def batches(args: GRPOConfig, world_size: int, errors: list[str]) -> Batches:
    P, A, G = int(args.per_device_train_batch_size), int(args.gradient_accumulation_steps), int(args.num_generations)
    gbs, spg = args.generation_batch_size, args.steps_per_generation
    if gbs is not None and spg is not None:
        errors.append("generation_batch_size and steps_per_generation: set one of them (TRL refuses both too)")
    if gbs is not None:
        if gbs % (P * world_size):
            errors.append(f"generation_batch_size={gbs} must be a multiple of per_device_train_batch_size x world size = {P * world_size}")
        spg = max(1, gbs // (P * world_size))
    spg = A if spg is None else int(spg)
    gbs = P * world_size * spg
    if gbs % G:
        errors.append(
            f"num_generations={G} must divide the generation batch, per_device_train_batch_size x world size x steps_per_generation "
            f"= {P} x {world_size} x {spg} = {gbs} (TRL refuses it too)"
        )
    if spg % A:
        errors.append(
            f"steps_per_generation={spg} must be a multiple of gradient_accumulation_steps={A}: rlvr ends each generation's "
            "completions with a whole optimizer step"
        )
    per_gen = max(1, spg // A)
    return Batches(max(1, gbs // G), G, per_gen, per_gen * int(args.num_iterations))


def _interval(strategy: str, every: float | None, b: Batches, total_steps: int, steps_per_epoch: int | None) -> int:
    """A TRL interval (steps, epoch, no; in optimizer steps, below 1 a share of the run) as rlvr steps (0: never)."""
    if strategy == "no" or every is None:
        return 0
    if strategy == "epoch":
        return steps_per_epoch or 0
    if 0 < every < 1:
        return max(1, math.ceil(every * total_steps))
    return b.steps(every)


def settings(args: GRPOConfig, *, world_size: int, rows: int | None, has_eval: bool, has_tools: bool) -> tuple[dict[str, Any], list[str]]:
    """(rlvr settings, notes) for `args`; ConfigError naming every field rlvr cannot honour. `rows`: the training
    dataset's size (None: an iterable dataset, which needs max_steps as in TRL). Settings that would change nothing
    (evaluation ones without an eval_dataset, tools ones without tools, KL ones at beta 0) are left at rlvr's."""
    errors: list[str] = []
    notes = _refusals(args, errors)
    b = batches(args, world_size, errors)
    s: dict[str, Any] = {
        "output_dir": args.output_dir or "trainer_output",
        "seed": args.seed,
        "rollout.group_size": b.group_size,
        "rollout.prompts_per_step": b.prompts_per_step,
        "optim.steps_per_generation": b.optimizer_steps_per_generation,
        "optim.micro_batch_size": int(args.per_device_train_batch_size),
        "rollout.max_new_tokens": args.max_completion_length,
        **{f"rollout.{k}": getattr(args, k) for k in ("temperature", "top_p", "top_k")},
        "rollout.min_p": args.min_p or 0.0,  # TRL's None: off
        "rollout.repetition_penalty": args.repetition_penalty,
        "data.shuffle": bool(args.shuffle_dataset) and args.train_sampling_strategy != "sequential",
        "data.chat_template_kwargs": dict(args.chat_template_kwargs or {}),
        **_generation_kwargs(args, errors),
    }
    steps_per_epoch = math.ceil(rows / b.prompts_per_step) if rows else None
    if args.max_steps is not None and args.max_steps > 0:
        s["steps"] = b.steps(args.max_steps)
        if args.max_steps % b.updates_per_step:
            notes.append(f"max_steps={args.max_steps} is not a whole number of rlvr steps ({b.updates_per_step} optimizer steps each)")
    elif steps_per_epoch is None:
        errors.append("max_steps: an IterableDataset has no length, so set max_steps (TRL needs it too)")
    else:
        s["steps"] = max(1, math.ceil(args.num_train_epochs * steps_per_epoch))
    total = s.get("steps", 1)
    s.update(_optimizer(args, b, total, errors))
    s.update(_model_and_devices(args, errors))
    s.update(_algo(args, has_tools))
    s.update(_generation_engine(args))
    s.update(_reference_sync(args, errors, notes))
    s.update(_logging(args, b, errors))
    s.update(_checkpoints(args, b, total, steps_per_epoch, errors, notes))
    every = _interval(str(args.eval_strategy), args.eval_steps or args.logging_steps, b, total, steps_per_epoch)
    s.update({"eval.before_after": has_eval and bool(args.eval_on_start), "eval.every": every if has_eval else 0})
    if has_eval:  # TRL samples num_generations_eval completions per prompt at the training temperature
        s.update({"eval.samples": args.num_generations_eval or args.num_generations, "eval.temperature": args.temperature})
    if errors:
        raise ConfigError("GRPOConfig: rlvr cannot honour these settings:\n  - " + "\n  - ".join(errors))
    return s, notes


def _refusals(args: GRPOConfig, errors: list[str]) -> list[str]:
    """Fields set away from TRL's default that rlvr refuses (an error each) or that change nothing here (a note each)."""
    notes = []
    for name, default in trl_defaults().items():
        value, rule = getattr(args, name), RULES[name]
        if rule.kind == "mapped" or _same(value, default):
            continue
        if rule.kind == "refused":
            errors.append(f"{name}={value!r}: {rule.what}")
        else:
            notes.append(f"GRPOConfig {name}={value!r} changes nothing in rlvr: {rule.what}")
    return notes


SAMPLING_KWARGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")  # rollout.<key>


def _generation_kwargs(args: GRPOConfig, errors: list[str]) -> dict[str, Any]:
    """TRL's generation_kwargs override its sampling fields: the keys rlvr samples with become rollout.<key>, any
    other is an error naming it."""
    out: dict[str, Any] = {}
    for key, value in (args.generation_kwargs or {}).items():
        if key in SAMPLING_KWARGS:
            out[f"rollout.{key}"] = 0.0 if key == "min_p" and value is None else value
        else:
            errors.append(f"generation_kwargs[{key!r}]={value!r}: rlvr samples with {', '.join(SAMPLING_KWARGS)}, max_completion_length")
    return out


def _same(value: Any, default: Any) -> bool:
    value, default = getattr(value, "value", value), getattr(default, "value", default)  # TRL's enums
    return value == default or (value in (None, [], {}, "") and default in (None, [], {}, ""))


def _optimizer(args: GRPOConfig, b: Batches, total_steps: int, errors: list[str]) -> dict[str, Any]:
    schedule = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    if schedule not in SCHEDULES:
        errors.append(f"lr_scheduler_type={schedule!r}: rlvr has {', '.join(SCHEDULES)}")
    optim = str(getattr(args.optim, "value", args.optim))
    if optim not in ADAMW:
        errors.append(f"optim={optim!r}: rlvr's optimizer is AdamW ({', '.join(ADAMW)})")
    warmup = args.warmup_steps or 0
    if 0 < warmup < 1:  # transformers 5: a share of the optimizer steps
        warmup = math.ceil(warmup * total_steps * b.updates_per_step)
    if schedule == "constant":  # transformers' constant schedule has no warmup
        warmup = 0
    return {
        "optim.lr": args.learning_rate,
        "optim.lr_schedule": SCHEDULES.get(schedule, "constant"),
        "optim.min_lr_rate": _min_lr_rate(args, schedule, errors),
        "optim.warmup_steps": int(warmup),
        "optim.warmup_from_zero": warmup > 0,  # transformers' schedules: the first update at rate 0
        "optim.weight_decay": args.weight_decay,
        "optim.beta1": args.adam_beta1,
        "optim.beta2": args.adam_beta2,
        "optim.eps": args.adam_epsilon,
        "optim.max_grad_norm": args.max_grad_norm,
        **({"optim.compile": "on"} if args.torch_compile else {}),
    }


def _min_lr_rate(args: GRPOConfig, schedule: str, errors: list[str]) -> float:
    """transformers' cosine_with_min_lr reads min_lr_rate, or min_lr (absolute), from lr_scheduler_kwargs; every other
    schedule here takes none (cosine's num_cycles only at its default, half a cosine)."""
    kwargs = dict(args.lr_scheduler_kwargs or {})
    if schedule == "cosine" and kwargs.get("num_cycles", 0.5) == 0.5:
        kwargs.pop("num_cycles", None)
    rate = 0.0
    if schedule == "cosine_with_min_lr":
        if ("min_lr" in kwargs) == ("min_lr_rate" in kwargs):
            errors.append(f"lr_scheduler_kwargs={kwargs!r}: cosine_with_min_lr takes one of min_lr_rate or min_lr (as transformers)")
        rate = kwargs.pop("min_lr_rate") if "min_lr_rate" in kwargs else kwargs.pop("min_lr", 0.0) / args.learning_rate
        kwargs.pop("min_lr", None)
    if kwargs:
        errors.append(f"lr_scheduler_kwargs={kwargs!r}: rlvr's schedules take min_lr_rate or min_lr with cosine_with_min_lr only")
    return float(rate)


def _model_and_devices(args: GRPOConfig, errors: list[str]) -> dict[str, Any]:
    s: dict[str, Any] = {"model.trust_remote_code": bool(args.trust_remote_code), "model.disable_dropout": bool(args.disable_dropout)}
    kwargs = dict(args.model_init_kwargs or {})
    dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", None))
    dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
    if dtype not in (None, "auto", "float32", "bfloat16", "float16"):
        errors.append(f"model_init_kwargs dtype={dtype!r}: rlvr trains float32, bfloat16 or float16 weights")
    elif dtype not in (None, "auto"):
        s["model.dtype"] = dtype
    s["model.trust_remote_code"] = bool(kwargs.pop("trust_remote_code", args.trust_remote_code))
    kwargs.pop("attn_implementation", None)  # transformers' default (SDPA) runs: the same math
    if kwargs:
        errors.append(f"model_init_kwargs {sorted(kwargs)}: rlvr takes dtype, trust_remote_code and attn_implementation")
    checkpointing = args.gradient_checkpointing if args.activation_checkpointing is None else args.activation_checkpointing
    s["model.gradient_checkpointing"] = bool(checkpointing)
    s["model.autocast"] = "auto" if args.bf16 is None else "bf16" if args.bf16 else "none"
    if args.use_cpu:
        s["device"] = "cpu"
    if args.ddp_backend:
        s["dist.backend"] = args.ddp_backend
    s["dist.timeout"] = float(args.ddp_timeout)
    if args.fsdp:
        s["dist.strategy"] = "fsdp"
    return s


_CONTROLLER = ("entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max")
_ALGO_SAME = [n for n, r in RULES.items() if r.what.startswith(f"algo.{n}:") and n not in _CONTROLLER]


def _algo(args: GRPOConfig, has_tools: bool) -> dict[str, Any]:
    s = {f"algo.{n}": getattr(args, n) for n in _ALGO_SAME}
    s["algo.clip_cov_ratio"] = 0.0  # TRL has no Clip-Cov (rlvr's default): a TRL script keeps TRL's loss
    if args.use_adaptive_entropy:  # the controller's settings act only with it (rlvr warns about them otherwise)
        s["algo.adaptive_entropy"] = True
        s.update({f"algo.{n}": getattr(args, n) for n in _CONTROLLER})
    scale = args.scale_rewards
    s["algo.scale_rewards"] = "group" if scale is True else "none" if scale is False else scale
    s["algo.reward_aggregation"] = args.multi_objective_aggregation
    if args.multi_objective_aggregation == "normalize_then_sum":  # TRL divides by the stds there whatever scale_rewards says
        s["algo.scale_rewards"] = "group"
    s["algo.std_ddof"], s["algo.std_eps"] = 1, 1e-4  # TRL's advantages: (r - mean) / (nanstd + 1e-4), nanstd with Bessel's correction
    if args.beta:
        s["algo.kl_bias_correction"] = bool(args.use_bias_correction_kl)
    turns = args.max_tool_calling_iterations
    if has_tools:  # TRL's None: no limit but the completion length (each turn takes at least one token)
        s["tools.max_turns"] = turns + 1 if turns is not None else args.max_completion_length + 1
    return s


def _checkpoints(args: GRPOConfig, b: Batches, total: int, steps_per_epoch: int | None, errors: list[str], notes: list[str]) -> dict:
    """save_strategy / save_steps / save_total_limit, and the best checkpoint: metric_for_best_model (TRL's eval_<name>
    is rlvr's eval/<name>), greater_is_better, load_best_model_at_end, save_strategy=best (a checkpoint at each new best)."""
    best = str(getattr(args.save_strategy, "value", args.save_strategy)) == "best"
    every = 0 if best else _interval(str(args.save_strategy), args.save_steps, b, total, steps_per_epoch)
    s: dict[str, Any] = {"checkpoint.every": every, "checkpoint.keep": args.save_total_limit or 0}
    metric = args.metric_for_best_model
    if metric is None:
        if best or args.load_best_model_at_end:
            errors.append(
                f"{'save_strategy=best' if best else 'load_best_model_at_end=True'} needs metric_for_best_model: TRL's default, the "
                "evaluation loss, is not computed by rlvr's held-out evaluation; e.g. metric_for_best_model='reward' (eval_reward)"
            )
        if args.greater_is_better is not None:
            notes.append(
                f"GRPOConfig greater_is_better={args.greater_is_better} changes nothing in rlvr: used only with metric_for_best_model"
            )
        return s
    name = metric.removeprefix("eval_")
    greater = args.greater_is_better if args.greater_is_better is not None else not name.endswith("loss")  # transformers' default
    s.update({"checkpoint.best_metric": f"eval/{name}", "checkpoint.greater_is_better": bool(greater)})
    return {**s, "checkpoint.load_best_at_end": bool(args.load_best_model_at_end)}


def _reference_sync(args: GRPOConfig, errors: list[str], notes: list[str]) -> dict[str, Any]:
    """TRL's SyncRefModelCallback: every ref_model_sync_steps optimizer steps (its global_step) the reference mixes in
    the policy, ref = alpha x policy + (1 - alpha) x ref."""
    if args.sync_ref_model and not args.beta:
        errors.append("sync_ref_model=True: with beta=0.0 there is no reference model to synchronise (TRL refuses it too)")
    if not args.sync_ref_model and args.ref_model_sync_steps != trl_defaults()["ref_model_sync_steps"]:
        notes.append(f"GRPOConfig ref_model_sync_steps={args.ref_model_sync_steps} changes nothing in rlvr: used only with sync_ref_model")
    steps = args.ref_model_sync_steps if args.sync_ref_model else 0
    return {"algo.ref_sync_steps": steps, "algo.ref_sync_alpha": args.ref_model_mixup_alpha}


def _generation_engine(args: GRPOConfig) -> dict[str, Any]:
    if not args.use_vllm:
        return {}
    s: dict[str, Any] = {}
    if args.vllm_mode == "server":
        host = "127.0.0.1" if args.vllm_server_host in ("0.0.0.0", "localhost") else args.vllm_server_host
        s["rollout.servers"] = [args.vllm_server_base_url or f"http://{host}:{args.vllm_server_port}"]
        s["rollout.server_timeout_s"] = float(args.vllm_server_timeout)
    else:
        s["rollout.engine"] = "vllm"
        s["rollout.vllm.gpu_memory_utilization"] = args.vllm_gpu_memory_utilization
        s["rollout.vllm.max_model_len"] = args.vllm_max_model_length
        s["rollout.vllm.sleep"] = bool(args.vllm_enable_sleep_mode)
    # TRL's modes are rlvr's (an unknown one fails validation by name); its clip_max=None bounds nothing from above
    s["algo.sampler_correction"] = args.vllm_importance_sampling_mode if args.vllm_importance_sampling_correction else "none"
    cap = args.vllm_importance_sampling_cap or args.vllm_importance_sampling_clip_max
    s["algo.sampler_correction_cap"] = math.inf if cap is None else cap
    s["algo.sampler_correction_min"] = args.vllm_importance_sampling_clip_min
    return s


def _logging(args: GRPOConfig, b: Batches, errors: list[str]) -> dict[str, Any]:
    s: dict[str, Any] = {"logging.completions_every": b.steps(args.logging_steps) if args.log_completions else 0}
    if args.num_completions_to_print:
        s["logging.num_completions"] = args.num_completions_to_print
    wanted = args.report_to if isinstance(args.report_to, list) else [args.report_to] if args.report_to else []
    if "all" in wanted:
        wanted = [d for d in DASHBOARDS if importlib.util.find_spec(d if d != "tensorboard" else "torch.utils.tensorboard")]
    wanted = [w for w in wanted if w != "none"]
    if bad := [w for w in wanted if w not in DASHBOARDS]:
        errors.append(f"report_to={bad}: rlvr writes to {', '.join(DASHBOARDS)} (and metrics.jsonl always)")
    s["logging.report_to"] = [w for w in wanted if w in DASHBOARDS]
    if args.train_sampling_strategy == "group_by_length":
        errors.append("train_sampling_strategy='group_by_length': rlvr draws prompts at random (or in order: 'sequential')")
    return s
