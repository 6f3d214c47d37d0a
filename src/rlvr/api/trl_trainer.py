"""`rlvr.GRPOTrainer`: TRL 1.16's GRPOTrainer(model, reward_funcs, args, train_dataset, ...) over rlvr's Trainer.

A TRL script runs unchanged with `from rlvr import GRPOConfig, GRPOTrainer`. The arguments become one rlvr
Config: GRPOConfig's fields through rlvr.api.trl_mapping, the Python objects (reward callables, datasets, a
loaded model or tokenizer, tools, an environment factory, a rollout function) named in it through rlvr.live,
peft's LoraConfig as model.lora.*. Whatever rlvr cannot honour is refused by name, all of it in one error.
The run is an rlvr run: its folder (metrics.jsonl, samples.jsonl, checkpoints/, final/, summary.json) works with
`rlvr report` and `rlvr doctor`.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable

from rlvr import live
from rlvr.api.callbacks import CallbackHooks
from rlvr.api.trl_config import GRPOConfig
from rlvr.api.trl_mapping import batches, settings
from rlvr.config import ConfigError, load_config
from rlvr.training import Trainer
from rlvr.training.run_folder import RunFinished, holds_a_run


class GRPOTrainer:
    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        tools: list[Callable] | None = None,
        rollout_func: Callable | None = None,
        environment_factory: Any = None,
    ):
        name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "name_or_path", "model")
        self.args = args if args is not None else GRPOConfig(output_dir=f"{str(name).split('/')[-1]}-GRPO")
        self.train_dataset, self.eval_dataset, self._processing_class = train_dataset, eval_dataset, processing_class
        self.reward_funcs = reward_funcs if isinstance(reward_funcs, list) else [] if reward_funcs is None else [reward_funcs]
        self.rollout_func = rollout_func
        self._live: dict[str, Any] = {}
        errors = _unsupported(reward_processing_classes, optimizers, quantization_config, model)
        import os

        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.batches = batches(self.args, world_size, [])
        rows = self._training_rows(errors)  # before the dataset is named in the config: an iterable one is read here
        objects = self._objects(model, tools, environment_factory, peft_config, errors)
        has_tools = bool(tools) or environment_factory is not None
        fields, self.notes = settings(self.args, world_size=world_size, rows=rows, has_eval=eval_dataset is not None, has_tools=has_tools)
        if errors:
            raise ConfigError("GRPOTrainer: rlvr cannot honour these arguments:\n  - " + "\n  - ".join(errors))
        fields.update(objects)
        fields["nproc"] = world_size
        if not has_tools and rollout_func is None:
            fields["rollout.max_new_tokens"] = self._completion_room(model, fields["rollout.max_new_tokens"])
        self.cfg = load_config(None, [f"{k}={_yaml(v)}" for k, v in fields.items()])
        self.hooks = CallbackHooks(list(callbacks or []), self.args, updates_per_step=self.batches.updates_per_step, steps=self.cfg.steps)
        self._trainer: Trainer | None = None
        self._deferred: Exception | None = None  # why the run in output_dir could not be resumed at once (train() decides)
        self.output_dir = Path(str(self.cfg.output_dir))  # always set: from args.output_dir (default trainer_output)
        self._build(resume="auto" if holds_a_run(self.output_dir) else None)
        if self._trainer is not None:
            self.hooks.call("on_init_end", self._trainer)

    # ------------------------------------------------------------------ the arguments as config settings

    def _register(self, obj, name: str) -> str:
        """`rlvr_live:NAME` for `obj`, remembered so that a later rebuild (a resume) names this trainer's objects again."""
        self._live[name] = obj
        return live.register(obj, name)

    def _spec_for(self, obj, name: str) -> str:
        """A callable's importable `module:name`, else its `rlvr_live:` name."""
        return live.importable_spec(obj) or self._register(obj, name)

    def _objects(self, model, tools, environment_factory, peft_config, errors: list[str]) -> dict[str, Any]:
        s: dict[str, Any] = {"data.path": self._register(self.train_dataset, "train_dataset") if self.train_dataset is not None else None}
        if self.train_dataset is None:
            errors.append(
                "train_dataset: rlvr.GRPOTrainer trains on a dataset (datasets.Dataset or IterableDataset with a `prompt` column)"
            )
        s["model.path"] = model if isinstance(model, str) else self._register(model, "model")
        if not isinstance(model, str):
            s["model.dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
        if self._processing_class is not None:
            s["model.tokenizer"] = self._register(self._processing_class, "processing_class")
        s["rewards"] = self._rewards(errors)
        if self.eval_dataset is not None:
            s.update(self._eval_dataset(s["rewards"], errors))
        if tools:
            s["tools.functions"] = [self._spec_for(t, f"tool_{i}_{getattr(t, '__name__', 'tool')}") for i, t in enumerate(tools)]
        if environment_factory is not None:
            if isinstance(environment_factory, dict):
                if len(environment_factory) != 1:
                    errors.append("environment_factory: a dict of several environments (rlvr takes one environment class)")
                environment_factory = next(iter(environment_factory.values()), None)
            s["tools.environment"] = self._spec_for(environment_factory, getattr(environment_factory, "__name__", "environment"))
        if self.rollout_func is not None:
            s["rollout.function"] = self._register(_TrlRollout(self.rollout_func, self), "rollout_func")
        if peft_config is not None:
            s.update(_lora(peft_config, model, errors))
        return s

    def _rewards(self, errors: list[str]) -> list[dict]:
        from rlvr.rewards import builtin_rewards

        weights = self.args.reward_weights
        if weights is not None and len(weights) != len(self.reward_funcs):
            errors.append(f"reward_weights: {len(weights)} weights for {len(self.reward_funcs)} reward functions")
        out = []
        for i, fn in enumerate(self.reward_funcs):
            if isinstance(fn, str) and fn not in builtin_rewards():
                errors.append(f"reward_funcs[{i}]={fn!r}: reward models are not supported; pass a function (or an rlvr built-in name)")
                continue
            if not isinstance(fn, str) and not callable(fn) or hasattr(fn, "config"):
                errors.append(f"reward_funcs[{i}]: reward models are not supported; pass a function")
                continue
            name = fn if isinstance(fn, str) else getattr(fn, "__name__", type(fn).__name__)
            spec = fn if isinstance(fn, str) else self._spec_for(fn, f"reward_{i}_{name}")  # lambdas share a __name__
            out.append({"fn": spec, "weight": float(weights[i]) if weights else 1.0, "name": name})
        return out

    def _eval_dataset(self, rewards: list[dict], errors: list[str]) -> dict[str, Any]:
        data = self.eval_dataset
        if isinstance(data, dict):
            if len(data) != 1:
                errors.append("eval_dataset: a dict of several datasets (rlvr evaluates one held-out set)")
            data = next(iter(data.values()), None)
        s: dict[str, Any] = {"eval.data": self._register(data, "eval_dataset")}
        if rewards:  # TRL's eval_reward: the reward functions' weighted sum (without any: the environment's get_reward)
            s["eval.reward"] = "all"
        return s

    def _training_rows(self, errors: list[str]) -> int | None:
        """The dataset's size; an IterableDataset is read now, as far as max_steps reaches."""
        data = self.train_dataset
        if data is None or hasattr(data, "__len__"):
            return len(data) if data is not None else 0
        if not self.args.max_steps or self.args.max_steps <= 0:
            return None  # refused by the mapping, naming max_steps
        needed = self.batches.steps(self.args.max_steps) * self.batches.prompts_per_step
        self.train_dataset = list(itertools.islice(iter(data), needed))
        return None

    def _completion_room(self, model, max_new_tokens: int) -> int:
        """max_completion_length, or less where the model's context leaves less after the longest prompt (TRL's
        generation would run past the context; rlvr refuses a budget that does not fit, so it is lowered, with a note)."""
        from rlvr.data import render_prompt
        from rlvr.models.loading import load_tokenizer, with_template_kwargs

        config = getattr(model, "config", None)
        if config is None:
            from transformers import AutoConfig

            from rlvr.models import resolve_model_path
            from rlvr.models.loading import resolve_existing

            config = AutoConfig.from_pretrained(
                resolve_existing(resolve_model_path(model)), trust_remote_code=bool(self.args.trust_remote_code)
            )
        context = getattr(config, "max_position_embeddings", None)
        data = self.train_dataset
        if not context or data is None or context >= 4 * max_new_tokens:  # long contexts: the usual case, nothing to measure
            return max_new_tokens
        tok = self._processing_class or load_tokenizer(model if isinstance(model, str) else self._register(model, "model"))[0]
        tok = with_template_kwargs(tok, self.args.chat_template_kwargs or {})
        prompts = data["prompt"] if hasattr(data, "column_names") else [r["prompt"] for r in data]
        longest = max((len(tok(render_prompt(p, tok), add_special_tokens=False)["input_ids"]) for p in prompts), default=0)
        room = context - longest
        if 0 < room < max_new_tokens:
            self.notes.append(
                f"max_completion_length={max_new_tokens} does not fit the model's context of {context} tokens after the longest prompt "
                f"({longest} tokens): completions are limited to {room} tokens"
            )
            return room
        return max_new_tokens

    # ------------------------------------------------------------------ the run

    def _build(self, resume: str | None) -> None:
        from dataclasses import replace

        self._deferred = None
        for name, obj in self._live.items():  # another GRPOTrainer in this process may have taken the names since
            live.register(obj, name)
        try:
            self._trainer = Trainer(
                replace(self.cfg, resume=resume), hooks=self.hooks, logger_live=False if self.args.disable_tqdm else None
            )
        except (ConfigError, RunFinished) as e:
            if resume is None:
                raise
            self._trainer, self._deferred = None, e  # decided by train(resume_from_checkpoint=...)
        self.resumed = resume
        if self._trainer is not None and self.eval_dataset is not None:  # read by evaluate() even with evaluation off in training
            self._trainer.warnings = [w for w in self._trainer.warnings if not w.startswith(("eval.data=", "eval.reward="))]
        for note in self.notes:
            print(f"[note] {note}")
        self.notes = []

    @property
    def state(self):
        return self.hooks.state

    @property
    def model(self):
        t = self._running("model")
        return t.policy.peft or t.policy.model

    @property
    def processing_class(self):
        """The tokenizer the run uses (the one given, or the model's own)."""
        return self._trainer.tokenizer if self._trainer is not None else self._processing_class

    @property
    def callback_handler(self):
        return self.hooks

    def add_callback(self, callback) -> None:
        self.hooks.callbacks.append(callback() if isinstance(callback, type) else callback)

    def remove_callback(self, callback) -> None:
        self.hooks.callbacks = [c for c in self.hooks.callbacks if c is not callback and type(c) is not callback]

    def _running(self, what: str):
        if self._trainer is None:
            raise ConfigError(
                f"trainer.{what}: output_dir {self.cfg.output_dir} holds a run; train(resume_from_checkpoint=True) "
                f"continues it ({self._deferred})"
            )
        return self._trainer

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """Train (TRL's Trainer.train); returns transformers' TrainOutput(global_step, training_loss, metrics)."""
        from transformers.trainer_utils import TrainOutput

        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments {sorted(kwargs)}")
        want = None if not resume_from_checkpoint else "auto" if resume_from_checkpoint is True else str(resume_from_checkpoint)
        if want is None and self.resumed is not None:
            raise ConfigError(
                f"output_dir {self.cfg.output_dir} already holds a run: continue it with trainer.train(resume_from_checkpoint=True), "
                "or choose another output_dir"
            )
        if isinstance(self._deferred, RunFinished):
            print(f"rlvr: {self._deferred}")
            return TrainOutput(self.hooks.state.global_step, 0.0, {})
        if want is not None and want != self.resumed:
            self._build(want)
        if want == "auto" and self.resumed is None:
            raise ConfigError(f"resume_from_checkpoint=True: no checkpoint in output_dir {self.cfg.output_dir}")
        self.summary = self._running("train").train()
        metrics = {"train_runtime": self.hooks.state.log_history[-1].get("train_runtime", 0.0)} if self.hooks.state.log_history else {}
        return TrainOutput(self.hooks.state.global_step, self.hooks.training_loss, metrics)

    def evaluate(self, eval_dataset: Any = None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        """The held-out metrics (eval_reward, and with several samples eval_pass@k, eval_avg@k, eval_maj@k)."""
        if eval_dataset is not None:
            raise ConfigError("trainer.evaluate(eval_dataset=...): pass the held-out set as GRPOTrainer(eval_dataset=...)")
        t = self._running("evaluate")
        score = t.evaluate()
        if score is None:
            raise ConfigError("trainer.evaluate(): no eval_dataset was given to GRPOTrainer")
        metrics = {f"{metric_key_prefix}_reward": score}
        metrics.update({f"{metric_key_prefix}_{k.removeprefix('eval/')}": v for k, v in (t.eval_metrics or {}).items()})
        self.hooks.evaluated(t, {"eval/" + k.removeprefix(f"{metric_key_prefix}_"): v for k, v in metrics.items()})
        return metrics

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The trained weights (the adapter with LoRA) and the tokenizer, in output_dir (default: args.output_dir)."""
        t = self._running("save_model")
        path = Path(output_dir) if output_dir else self.output_dir
        if t.dist.is_main:
            path.mkdir(parents=True, exist_ok=True)
            t.policy.save(path)
            t.tokenizer.save_pretrained(path)
        t.dist.barrier("save_model")

    # ------------------------------------------------------------------ what transformers' Trainer also offers scripts

    def is_world_process_zero(self) -> bool:
        return self.args.process_index == 0

    @property
    def accelerator(self):
        """The few attributes scripts read from TRL's accelerate Accelerator (rlvr runs its own process group)."""
        import types

        device = self._trainer.device if self._trainer is not None else None
        ws, rank = self.args.world_size, self.args.process_index
        return types.SimpleNamespace(is_main_process=rank == 0, process_index=rank, num_processes=ws, device=device)

    def log_metrics(self, split: str, metrics: dict) -> None:
        """Print the metrics (transformers' Trainer.log_metrics), on rank 0."""
        if self.is_world_process_zero():
            print(f"***** {split} metrics *****")
            for key in sorted(metrics):
                print(f"  {key} = {metrics[key]}")

    def save_metrics(self, split: str, metrics: dict, combined: bool = True) -> None:
        """<output_dir>/<split>_results.json (transformers' Trainer.save_metrics, without the combined file's merge)."""
        import json

        if self.is_world_process_zero():
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / f"{split}_results.json").write_text(json.dumps(metrics, indent=4, sort_keys=True, default=str))

    def save_state(self) -> None:
        """<output_dir>/trainer_state.json: the TrainerState (log_history, global_step), as transformers writes it."""
        if self.is_world_process_zero():
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self.state.save_to_json(str(self.output_dir / "trainer_state.json"))

    def push_to_hub(self, *args, **kwargs):
        raise ConfigError(
            "trainer.push_to_hub(): rlvr does not upload; the trained model is in <output_dir>/final "
            "(upload it with huggingface_hub's upload_folder)"
        )


class _TrlRollout:
    """TRL's rollout_func(prompts, trainer) under rlvr's rollout-function contract: TRL gives it each prompt
    num_generations times (the sampler repeats them) and it returns one episode per entry."""

    def __init__(self, fn: Callable, trainer: GRPOTrainer):
        self.fn, self.trainer, self.__name__ = fn, trainer, getattr(fn, "__name__", "rollout_func")

    def __call__(self, prompts, *, model, tokenizer, sampling, seeds, generate=None) -> dict:
        return self.fn([p for p in prompts for _ in range(sampling.n)], self.trainer)


def _unsupported(reward_processing_classes, optimizers, quantization_config, model) -> list[str]:
    errors = []
    if reward_processing_classes is not None:
        errors.append("reward_processing_classes: reward models are not supported")
    if optimizers is not None and any(o is not None for o in optimizers):
        errors.append("optimizers: rlvr builds its own AdamW and schedule (set learning_rate, lr_scheduler_type, ... in GRPOConfig)")
    if quantization_config is not None:
        errors.append("quantization_config: use peft_config with model.lora.quantize (4bit/8bit) through rlvr's config")
    if type(model).__name__.startswith("Peft"):
        errors.append("model: a PeftModel; pass the base model and peft_config=LoraConfig(...)")
    return errors


def _lora(peft_config, model, errors: list[str]) -> dict[str, Any]:
    """peft's LoraConfig as model.lora.*; fields rlvr does not take are refused when changed from peft's defaults."""
    import peft

    taken = {"r", "lora_alpha", "lora_dropout", "target_modules", "task_type", "peft_type", "inference_mode", "base_model_name_or_path"}
    taken |= {"revision", "auto_mapping"}
    default = peft.LoraConfig()
    for key, value in vars(peft_config).items():
        if key not in taken and not key.startswith("_") and value != getattr(default, key, value):
            errors.append(f"peft_config.{key}={value!r}: rlvr's LoRA takes r, lora_alpha, lora_dropout and target_modules")
    targets = peft_config.target_modules
    if targets is None:  # peft's default for the model's architecture
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as defaults

        kind = getattr(getattr(model, "config", None), "model_type", None) or _model_type(model)
        targets = defaults.get(kind or "")
        if targets is None:
            errors.append(f"peft_config.target_modules: peft has no default for model type {kind!r}; name the modules")
    targets = [targets] if isinstance(targets, str) else sorted(targets or [])
    return {
        "model.lora.r": peft_config.r,
        "model.lora.alpha": float(peft_config.lora_alpha),
        "model.lora.dropout": peft_config.lora_dropout,
        "model.lora.target_modules": targets,
    }


def _model_type(model) -> str | None:
    if not isinstance(model, str):
        return None
    from transformers import AutoConfig

    from rlvr.models import resolve_model_path

    return getattr(AutoConfig.from_pretrained(resolve_model_path(model)), "model_type", None)


def _yaml(value: Any) -> str:
    import json

    return json.dumps(value)
