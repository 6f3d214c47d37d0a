"""Validation: every problem of a config at once, each naming its field and a value that works.

Names that other packages define (loss types, KL estimators, engines, ...) arrive in `choices`,
so this package imports nothing from the rest of rlvr (rlvr.training.setup passes the registries).
"""

from __future__ import annotations

import difflib
import math
from typing import Callable, Collection, Mapping

from rlvr.config.no_effect import no_effect_warnings
from rlvr.config.schema import Config, ConfigError
from rlvr.config.validate_algo import validate_algo
from rlvr.config.validate_rollout import validate_rollout

# choice(key, value, options): an error naming `key` unless value is one of options (the closest one suggested)
Choice = Callable[[str, object, Collection[str]], None]


def batch_split_errors(cfg: Config, world_size: int) -> list[str]:
    """Problems with splitting cfg's batch over `world_size` ranks, each naming what to change."""
    r, o, a = cfg.rollout, cfg.optim, cfg.algo
    errors: list[str] = []
    P, G, W = r.prompts_per_step, r.group_size, world_size
    if P < 1 or G < 1:
        return errors  # reported elsewhere
    if P % W:
        up, down = math.ceil(P / W) * W, max(d for d in range(1, W + 1) if P % d == 0)
        errors.append(
            f"`rollout.prompts_per_step`={P} does not split over {W} ranks (each group of {G} completions stays whole on one rank): "
            f"set rollout.prompts_per_step to a multiple of {W} (e.g. {up}), or nproc to {down}"
        )
    k = o.steps_per_generation
    if k > 1 and P % (k * W):
        fits = [d for d in range(1, P + 1) if P % (d * W) == 0]
        errors.append(
            f"`optim.steps_per_generation`={k} does not split {P} prompts into {k} minibatches of whole groups"
            + (f" over {W} ranks each" if W > 1 else "")
            + f": set rollout.prompts_per_step to a multiple of {k * W} (e.g. {math.ceil(P / (k * W)) * k * W}), "
            f"or steps_per_generation to one of {fits}"
        )
    if W > 1 and a.top_entropy_quantile < 1:
        errors.append(
            f"`algo.top_entropy_quantile`={a.top_entropy_quantile} picks tokens by a whole-batch quantile, "
            "which is not reduced across ranks yet: "
            "set it to 1.0, or nproc to 1"
        )
    return errors


def micro_batch_note(cfg: Config, world_size: int) -> str | None:
    """A micro-batch larger than the completions one update has per rank is those completions, in one forward/backward:
    say so (shrinking rollout.prompts_per_step below a pinned micro_batch_size is no mistake)."""
    P, G, W = cfg.rollout.prompts_per_step, cfg.rollout.group_size, world_size
    k, m = cfg.optim.steps_per_generation, cfg.optim.micro_batch_size
    if m <= 0 or P < 1 or G < 1 or k < 1 or P % W:
        return None
    minibatch = math.ceil(P * G // W / k)
    if m <= minibatch:
        return None
    what = "per step (rollout.prompts_per_step x rollout.group_size)" if W == 1 else f"per rank ({P} prompts x {G} completions / {W} ranks)"
    if k > 1:
        what = f"{'per rank ' if W > 1 else ''}per update (a step's {P * G // W} / optim.steps_per_generation={k})"
    return f"optim.micro_batch_size={m} is larger than the {minibatch} completions {what}: each update runs them as one micro-batch"


def _validate_scale_out(cfg: Config, errors: list[str], choice: Choice) -> None:
    """nproc, dist.*, model.lora.* and how the batch splits across ranks."""
    lo, d = cfg.model.lora, cfg.dist
    if cfg.nproc < 1:
        errors.append(f"`nproc` must be >= 1, got {cfg.nproc}")
    else:
        errors += batch_split_errors(cfg, cfg.nproc)
    choice("dist.strategy", d.strategy, ["ddp", "fsdp"])
    choice("dist.backend", d.backend, ["auto", "gloo", "nccl"])
    if d.strategy == "fsdp" and cfg.nproc > 1 and lo.save_merged:
        errors.append(
            "`model.lora.save_merged` is not implemented with dist.strategy=fsdp (the sharded model cannot be copied to merge): "
            "set it to false and merge final/'s adapter afterwards "
            "(peft: PeftModel.from_pretrained(base, 'final').merge_and_unload()), or use ddp"
        )
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
        errors.append(
            f"`model.lora.quantize`={lo.quantize} freezes quantised base weights: it needs LoRA adapters, set model.lora.r (e.g. 16)"
        )
    if lo.quantize != "none" and cfg.device == "cpu":
        errors.append(f"`model.lora.quantize`={lo.quantize} needs bitsandbytes on a CUDA GPU; set it to none on device=cpu")
    if lo.save_merged and lo.r == 0:
        errors.append("`model.lora.save_merged` needs LoRA (model.lora.r > 0)")


# Settings whose valid values are registries of other packages (passed to `validate` as `choices`).
REGISTERED = (
    "algo.loss_type",
    "algo.importance_sampling_level",
    "algo.kl_estimator",
    "algo.scale_rewards",
    "algo.reward_aggregation",
    "algo.sampler_correction",
    "rollout.engine",
    "data.task",
)


def _validate_tools(cfg: Config, errors: list[str], choice: Choice) -> None:
    t = cfg.tools
    choice("tools.format", t.format, ["auto", "tags", "chat_template"])
    if t.max_turns < 1:
        errors.append(f"`tools.max_turns` must be >= 1, got {t.max_turns}")
    if t.timeout_s <= 0:
        errors.append(f"`tools.timeout_s` must be positive (seconds), got {t.timeout_s}")
    if t.max_result_chars < 1:
        errors.append(f"`tools.max_result_chars` must be >= 1, got {t.max_result_chars}")
    if len(t.result_tags) != 2:
        errors.append(f"`tools.result_tags` must be [opening, closing], got {t.result_tags}")
    for pair in t.tags:
        if pair.count("=") != 1 or not all(pair.split("=")):
            errors.append(f"`tools.tags` entries are `tool=tag` (e.g. calculator=calc), got {pair!r}")
    if t.enabled and cfg.rollout.function:
        errors.append("`rollout.function` makes the episodes itself: it cannot be combined with `tools`; run the tools inside it")


def _tools_without_effect(cfg: Config, warnings: list[str]) -> None:
    """tools.* settings that change nothing: any of them without tools, a max_turns that leaves no turn to read a result.
    (Those that depend on the format auto chooses are checked with the tokenizer, in rlvr.rollout.sources.)"""
    t, defaults = cfg.tools, type(cfg.tools)()
    if not t.enabled:
        keys = ("format", "tags", "result_tags", "describe", "max_turns", "timeout_s", "max_result_chars")
        changed = [k for k in keys if getattr(t, k) != getattr(defaults, k)]
        if not cfg.rollout.agent:
            warnings += [f"tools.{k} has no effect without tools (tools.functions or tools.environment)" for k in changed]
        else:  # the agent runs its own tools; its endpoint speaks the tags format's settings
            tag_keys = ("tags", "result_tags", "describe")
            why = {k: "the agent runs its own tools and turns" for k in keys[4:]}
            why.update({k: "it applies with tools.format=tags" for k in tag_keys if t.format != "tags"})
            warnings += [f"tools.{k} has no effect with rollout.agent: {why[k]}" for k in changed if k in why]
    elif t.max_turns == 1:
        warnings.append("tools.max_turns=1: a call made in the last turn is not run, so no tool ever runs; set it to 2 or more")


def _validate_eval(cfg: Config, errors: list[str], warnings: list[str]) -> None:
    e = cfg.eval
    if e.every < 0:
        errors.append(f"`eval.every` must be >= 0 (0: only before and after training), got {e.every}")
    if e.size < 0:
        errors.append(f"`eval.size` must be >= 0 (0: every row), got {e.size}")
    if e.samples < 1:
        errors.append(f"`eval.samples` must be >= 1 (1: greedy), got {e.samples}")
    if e.samples > 1 and e.temperature <= 0:
        errors.append(f"`eval.temperature` must be positive to sample eval.samples={e.samples} episodes per row, got {e.temperature}")
    if e.data is not None and e.reward is None and not cfg.rewards and cfg.tools.environment is None:
        errors.append("`eval.data` is set but nothing scores it: set eval.reward (e.g. eval.reward=math)")
    if e.reward == "all" and not cfg.rewards:
        errors.append("`eval.reward`=all sums the training's reward functions (rewards.*), and rewards is empty")
    has_held_out = e.data is not None or cfg.data.builtin_task is not None
    if not has_held_out and e.every:
        errors.append(
            f"`eval.every`={e.every} but a data.path run has no held-out set: set eval.data (a held-out file) "
            "and eval.reward, or eval.every=0"
        )
    elif not has_held_out and e.before_after:
        warnings.append(
            "no held-out evaluation: data.path has no held-out split; set eval.data (a held-out file) and "
            "eval.reward for before/after numbers"
        )


def _validate_optim(cfg: Config, errors: list[str], choice: Choice) -> None:
    """optim.*, and the precision and device the optimizer steps run in."""
    o = cfg.optim
    choice("optim.lr_schedule", o.lr_schedule, ["constant", "linear", "cosine"])
    if not 0 <= o.min_lr_rate <= 1:
        errors.append(f"`optim.min_lr_rate` must be in [0, 1] (a share of optim.lr), got {o.min_lr_rate}")
    choice("model.dtype", cfg.model.dtype, ["float32", "bfloat16", "float16"])
    choice("model.autocast", cfg.model.autocast, ["auto", "bf16", "none"])
    choice("device", cfg.device, ["auto", "cpu", "cuda"])
    if o.lr <= 0:
        errors.append(f"`optim.lr` must be positive, got {o.lr}")
    if o.max_grad_norm < 0:
        errors.append(f"`optim.max_grad_norm` must be >= 0, got {o.max_grad_norm}")
    if not o.eps >= 0:
        errors.append(f"`optim.eps` must be >= 0, got {o.eps}")
    if o.micro_batch_size < 0:
        errors.append(f"`optim.micro_batch_size` must be >= 0, got {o.micro_batch_size}")
    if o.steps_per_generation < 1:
        errors.append(f"`optim.steps_per_generation` must be >= 1 (1: one optimizer step per batch and pass), got {o.steps_per_generation}")
    choice("optim.compile", o.compile, ["auto", "on", "off"])
    if o.compile == "on" and cfg.nproc > 1:
        errors.append(
            "`optim.compile`=on is not supported with nproc > 1 yet (compiling a DDP/FSDP-wrapped model is untested here): "
            "set optim.compile=off (or auto), or nproc=1"
        )


def _validate_run(cfg: Config, errors: list[str], choice: Choice, tasks: Collection[str]) -> None:
    """The run's length and stopping rules, what scores it, where its data comes from and its logging."""
    if cfg.max_bad_steps < 1:
        errors.append(f"`max_bad_steps` must be >= 1, got {cfg.max_bad_steps}")
    if cfg.max_failed_reward_steps < 0:
        errors.append(f"`max_failed_reward_steps` must be >= 0 (0: never stop), got {cfg.max_failed_reward_steps}; e.g. 3")
    if cfg.steps < 1:
        errors.append(f"`steps` must be >= 1, got {cfg.steps}")
    if not cfg.rewards and cfg.tools.environment is None and not cfg.rollout.agent:
        errors.append(
            "`rewards` is empty: at least one reward function is needed (or an environment whose get_reward() scores episodes, "
            "or a rollout.agent that returns rewards)"
        )
    if cfg.data.task is not None:
        choice("data.task", cfg.data.task, tasks)
        if cfg.data.path is not None:
            errors.append(
                f"`data.task`={cfg.data.task} and `data.path`={cfg.data.path} are both set: remove data.task (or set it "
                "to null) to train on data.path, or remove data.path to train on the built-in task"
            )
    kwargs = cfg.data.chat_template_kwargs
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        errors.append(f"`data.chat_template_kwargs` must map variable names to values, e.g. {{enable_thinking: false}}; got {kwargs!r}")
    lg = cfg.logging
    for name in lg.report_to:
        choice("logging.report_to", name, ["tensorboard", "wandb", "trackio", "none"])
    for key, value, zero in (
        ("logging.doctor_every", lg.doctor_every, "never"),
        ("logging.completions_every", lg.completions_every, "never"),
        ("logging.num_completions", lg.num_completions, "none"),
        ("checkpoint.every", cfg.checkpoint.every, "only at the end and at a stop"),
        ("checkpoint.keep", cfg.checkpoint.keep, "keep every one"),
    ):
        if value < 0:
            errors.append(f"`{key}` must be >= 0 (0: {zero}), got {value}")
    _validate_best_checkpoint(cfg, errors)


def _validate_best_checkpoint(cfg: Config, errors: list[str]) -> None:
    """checkpoint.best_metric names a held-out metric of the evaluations during training."""
    c = cfg.checkpoint
    if c.best_metric is not None:
        name = c.best_metric
        if not name.startswith("eval/"):
            guess = "eval/" + name.removeprefix("eval_").removeprefix("eval")
            errors.append(
                f"`checkpoint.best_metric` names a held-out metric, e.g. eval/reward or eval/pass@4, got {name!r}; did you mean `{guess}`?"
            )
        if cfg.eval.every <= 0:
            errors.append(f"`checkpoint.best_metric`={name} needs evaluations during training: set eval.every > 0")
        if (needs := _what_logs(name, cfg)) is not None:
            errors.append(f"`checkpoint.best_metric`={name} is logged only {needs}")
    if c.load_best_at_end and c.best_metric is None:
        errors.append("`checkpoint.load_best_at_end` needs checkpoint.best_metric: the held-out metric that picks the best checkpoint")


def _what_logs(name: str, cfg: Config) -> str | None:
    """What the evaluation needs to log held-out metric `name` that this config lacks (None: nothing it can tell)."""
    e, metric = cfg.eval, name.removeprefix("eval/")
    k = metric.split("@", 1)[1] if "@" in metric else ""
    if metric.split("@")[0] in ("pass", "avg", "maj") and not k.isdigit():
        return "as pass@K, avg@N or maj@N with numbers"
    if metric.startswith("pass@") and not (1 < e.samples and 1 <= int(k) <= e.samples and int(k) & (int(k) - 1) == 0):
        return f"for K = 1, 2, 4, ... up to eval.samples > 1 (eval.samples={e.samples})"
    if metric.split("@")[0] in ("avg", "maj") and not (e.samples > 1 and int(k) == e.samples):
        return f"at N = eval.samples > 1 (eval.samples={e.samples})"
    if (metric == "reward_std" or metric.startswith("rewards/")) and e.reward != "all":
        return "with eval.reward=all (the training's rewards weighted and summed, each function's mean and std beside)"
    return None


def _kl_and_temperature_warnings(cfg: Config, warnings: list[str], force: bool) -> None:
    r, a = cfg.rollout, cfg.algo
    if r.temperature == 0 and force and r.group_size > 1:
        warnings.append("rollout.temperature=0 forced: the G completions of a prompt will be identical, so most groups give no signal")
    if a.beta == 0:
        warnings.append("no KL penalty (algo.beta=0): no reference model is loaded")
    elif cfg.model.lora.r > 0:
        warnings.append(
            f"KL penalty on (algo.beta={a.beta}, {a.kl_estimator} estimator): "
            "the reference is the base model with the adapter disabled (no second copy)"
        )
    else:
        warnings.append(
            f"KL penalty on (algo.beta={a.beta}, {a.kl_estimator} estimator): "
            "a frozen reference model is loaded (a second copy of the weights)"
        )


def validate(cfg: Config, *, choices: Mapping[str, Collection[str]], force: bool = False) -> list[str]:
    """Raise ConfigError listing every invalid field; return warnings (the seeds' common mistakes).
    `choices`: the valid values of each REGISTERED setting (rlvr.training.setup.registered_choices)."""
    if missing := [k for k in REGISTERED if k not in choices]:
        raise ValueError(f"validate: no choices given for {missing}")
    errors: list[str] = []
    warnings: list[str] = []

    def choice(key: str, value: object, options: Collection[str]) -> None:
        if value not in options:
            close = difflib.get_close_matches(str(value), list(options), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            errors.append(f"`{key}` must be one of {sorted(options)}, got {value!r}{hint}")

    validate_rollout(cfg, errors, warnings, choice, choices["rollout.engine"], force)
    validate_algo(cfg, errors, warnings, choice, choices)
    _validate_optim(cfg, errors, choice)
    _validate_scale_out(cfg, errors, choice)
    _validate_tools(cfg, errors, choice)
    _tools_without_effect(cfg, warnings)
    _validate_run(cfg, errors, choice, choices["data.task"])
    _validate_eval(cfg, errors, warnings)
    _kl_and_temperature_warnings(cfg, warnings, force)
    if cfg.nproc >= 1 and (note := micro_batch_note(cfg, cfg.nproc)):
        warnings.append(note)
    warnings += no_effect_warnings(cfg)
    if errors:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))
    return warnings
