"""Settings that do nothing in the config they are in: a value the user changed from its default
whose part of rlvr does not run (data.digits with data.path, model.lora.alpha with LoRA off,
eval.* with evaluation off, rollout.vllm.* with the hf engine, ...). Each becomes a warning that
names the setting and why it has no effect; the run itself is unchanged.

"Changed" is "differs from the default": config.yaml of a run holds every key, so presence in the
YAML cannot tell what the user meant, and a default value changes nothing either way."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from rlvr.config.schema import Config
from rlvr.config.validate_rollout import applied_sampler_correction

# The file types data.path / eval.data read directly (rlvr.data.loaders.READERS); anything else is a `datasets` dataset.
_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
_DATASETS_ONLY = "split and subset pick part of a `datasets` dataset"
_EVAL_FIELDS = ("data", "split", "subset", "prompt_column", "reward", "size")


def changed(section: object, names: Iterable[str]) -> list[str]:
    """The fields of a config section (a dataclass) among `names` whose value differs from the default."""
    default = type(section)()
    return [n for n in names if getattr(section, n) != getattr(default, n)]


def _say(prefix: str, section: object, names: Iterable[str], why: str) -> list[str]:
    return [f"{prefix}{n}={_show(getattr(section, n))} has no effect: {why}" for n in changed(section, names)]


def _show(value: object) -> str:
    return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list) else str(value)


def _is_file(path: str | None) -> bool:
    return path is not None and Path(path).suffix.lower() in _FILE_SUFFIXES


def _data(cfg: Config) -> list[str]:
    d, task, evaluates = cfg.data, cfg.data.builtin_task, cfg.eval.before_after or cfg.eval.every > 0
    if task is None:
        out = _say(
            "data.",
            d,
            ("digits", "operators", "eval_size"),
            f"it configures a built-in task, and data.path={d.path} trains on "
            "a dataset (its held-out set is eval.data, limited by eval.size)",
        )
        if _is_file(d.path):
            out += _say("data.", d, ("split", "subset"), f"data.path={d.path} is a file; {_DATASETS_ONLY}")
        return out
    # eval.data without its own prompt_column reads data.prompt_column
    reads_column = cfg.eval.data is not None and cfg.eval.prompt_column is None and evaluates
    unused = [n for n in ("split", "subset", "prompt_column", "shuffle") if not (n == "prompt_column" and reads_column)]
    out = _say("data.", d, unused, f"it applies to data.path, and the built-in task {task} makes its own prompts")
    if task != "arithmetic":
        out += _say("data.", d, ("digits", "operators"), f"only the arithmetic task uses it, and data.task={task}")
    if cfg.eval.data is not None and evaluates:
        out += _say("data.", d, ("eval_size",), f"the held-out set is eval.data={cfg.eval.data} (limited by eval.size)")
    return out


def _eval(cfg: Config) -> list[str]:
    e = cfg.eval
    if not (e.before_after or e.every > 0):
        off = "evaluation is off in training (eval.before_after=false, eval.every=0); only `rlvr eval RUN` reads it"
        return _say("eval.", e, _EVAL_FIELDS, off) + (_say("data.", cfg.data, ("eval_size",), off) if cfg.data.builtin_task else [])
    if e.data is None:
        unused = ("split", "subset", "prompt_column", "size") + (() if cfg.data.builtin_task else ("reward",))
        held = "the built-in task's held-out set is used (size: data.eval_size)" if cfg.data.builtin_task else "there is no held-out set"
        return _say("eval.", e, unused, f"it applies to eval.data, which is unset: {held}")
    if _is_file(e.data):
        return _say("eval.", e, ("split", "subset"), f"eval.data={e.data} is a file; {_DATASETS_ONLY}")
    return []


def _model_and_rollout(cfg: Config) -> list[str]:
    r = cfg.rollout
    out = []
    if cfg.model.lora.r == 0:
        out += _say(
            "model.lora.",
            cfg.model.lora,
            ("alpha", "dropout", "target_modules", "merge_for_generation"),
            "LoRA is off (model.lora.r=0); set model.lora.r (e.g. 16) to train adapters",
        )
    if r.engine != "vllm":
        out += _say(
            "rollout.vllm.",
            r.vllm,
            [f.name for f in dataclasses.fields(r.vllm)],
            f"it configures the vllm engine, and rollout.engine={r.engine}",
        )
    if r.temperature == 0:
        out += _say("rollout.", r, ("top_p", "top_k", "min_p", "repetition_penalty"), "rollout.temperature=0 decodes greedily")
    return out


def _algo_and_logging(cfg: Config) -> list[str]:
    a = cfg.algo
    out = []
    if a.beta == 0:
        out += _say("algo.", a, ("kl_estimator", "ref_sync_steps", "ref_sync_alpha"), "there is no KL term (algo.beta=0)")
    elif a.ref_sync_steps == 0:
        out += _say("algo.", a, ("ref_sync_alpha",), "algo.ref_sync_steps=0 keeps the reference at the initial policy")
    if not a.dynamic_sampling:
        out += _say("algo.", a, ("max_resample_rounds",), "algo.dynamic_sampling is off")
    if a.clip_cov_ratio == 0:
        out += _say("algo.", a, ("clip_cov_lb", "clip_cov_ub"), "Clip-Cov is off (algo.clip_cov_ratio=0)")
    if a.kl_cov_ratio == 0:
        out += _say("algo.", a, ("kl_cov_coef",), "KL-Cov is off (algo.kl_cov_ratio=0)")
    if not a.adaptive_entropy:
        controller = ("entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max")
        out += _say("algo.", a, controller, "algo.adaptive_entropy is off (the entropy bonus keeps algo.entropy_coef)")
    if applied_sampler_correction(cfg) == "none":
        why = (
            "algo.sampler_correction=none"
            if a.sampler_correction == "none"
            else f"algo.sampler_correction=auto corrects nothing with rollout.engine={cfg.rollout.engine} "
            "(its sampler is the trained model)"
        )
        out += _say("algo.", a, ("sampler_correction_cap", "sampler_correction_min"), why)
    if a.scale_rewards == "none":
        out += _say("algo.", a, ("std_ddof", "std_eps"), "algo.scale_rewards=none divides by no standard deviation")
    if cfg.checkpoint.best_metric is None:
        out += _say("checkpoint.", cfg.checkpoint, ("greater_is_better",), "checkpoint.best_metric is not set")
    o = cfg.optim
    if o.lr_schedule != "cosine":
        out += _say("optim.", o, ("min_lr_rate",), f"only the cosine schedule ends above 0, and optim.lr_schedule={o.lr_schedule}")
    if o.warmup_steps == 0:
        out += _say("optim.", o, ("warmup_from_zero",), "there is no warm-up (optim.warmup_steps=0)")
    if cfg.logging.completions_every == 0:
        out += _say("logging.", cfg.logging, ("num_completions",), "logging.completions_every=0 logs no completions")
    return out


def no_effect_warnings(cfg: Config) -> list[str]:
    """A warning for every changed setting that the rest of the config leaves unused."""
    return _data(cfg) + _eval(cfg) + _model_and_rollout(cfg) + _algo_and_logging(cfg)
