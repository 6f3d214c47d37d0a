"""`rlvr eval`: what to evaluate and how, from the command line and, for a run, its config.yaml.

MODEL is a model folder, a hub id or `tiny`, or a run: its folder (evaluated through its final/),
its final/ (or final-merged/), or one of its checkpoints. A run is evaluated the way its trainer
evaluated it (Trainer.evaluate): the same rollout source (single-turn, or multi-turn with its
tools, environment and tool format, built by rlvr.rollout.sources.make_source), system prompt,
held-out set (eval.data with its prompt column and reward, or the built-in task with its size),
rollout.max_new_tokens, dtype and precision, so `rlvr eval RUN` prints the run's own held-out number.
The tool flags (and `tools.KEY=VALUE` overrides) set the config's tools.* keys, for a run or any
model; `--task` with a tool task (multiplication, guess_number) brings the task's tools where
nothing else sets tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import yaml

from rlvr.config import Config, ConfigError, load_config
from rlvr.tasks import TASKS, Task, get_task
from rlvr.training.checkpoint import latest_checkpoint, old_run_overrides
from rlvr.training.evaluation import HeldOut, dataset_held_out, held_out_for, task_held_out, weighing_all
from rlvr.training.setup import check_config

# flag -> the tools.* key it sets (`rlvr eval --help` names both)
TOOL_FLAGS = {
    "tools": "functions",
    "environment": "environment",
    "tool_format": "format",
    "tool_tags": "tags",
    "tool_describe": "describe",
    "max_turns": "max_turns",
}


@dataclass
class EvalOptions:
    """What `rlvr eval` and `rlvr.evaluate` are asked: each option of `rlvr eval` (None: not given, the run's or
    the default), under the name argparse gives it; the functions below read these attributes."""

    task: str | None = None
    """--task: a built-in task's held-out problems."""
    data: str | None = None
    """--data: your held-out prompts (a file, a datasets folder or hub id)."""
    reward: str | None = None
    """--reward: what scores each completion (a built-in reward or file.py:function)."""
    prompt_column: str | None = None
    """--prompt-column: --data's column holding the prompt."""
    split: str | None = None
    """--split: --data as a datasets dataset: the split."""
    subset: str | None = None
    """--subset: --data as a datasets dataset: the configuration name."""
    n: int | None = None
    """--n: evaluate this many rows."""
    digits: int | None = None
    """--digits: arithmetic's digits per operand."""
    operators: str | None = None
    """--operators: arithmetic's operators."""
    max_new_tokens: int | None = None
    """--max-new-tokens: the completion length limit."""
    samples: int | None = None
    """--samples: episodes per row (eval.samples)."""
    temperature: float | None = None
    """--temperature: the sampling temperature with samples > 1 (eval.temperature)."""
    system_prompt: str | None = None
    """--system-prompt: system message before every prompt ('' for none)."""
    agent: str | None = None
    """--agent: rollout.agent, your agent against the model's endpoint."""
    agent_timeout: float | None = None
    """--agent-timeout: rollout.agent_timeout."""
    tools: list[str] | None = None
    """--tools (repeatable, comma-separated): tools.functions."""
    environment: str | None = None
    """--environment: tools.environment."""
    tool_format: str | None = None
    """--tool-format: tools.format."""
    tool_tags: list[str] | None = None
    """--tool-tags (repeatable, TOOL=TAG): tools.tags."""
    tool_describe: bool | None = None
    """--tool-describe / --no-tool-describe: tools.describe."""
    max_turns: int | None = None
    """--max-turns: tools.max_turns."""
    overrides: list[str] = field(default_factory=list)
    """`tools.KEY=VALUE` overrides."""

    @classmethod
    def from_namespace(cls, args) -> EvalOptions:
        """The options of a parsed `rlvr eval` command line."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


@dataclass
class Target:
    """What `rlvr eval MODEL` loads, and the run it belongs to (if any)."""

    model: str  # the model folder (a run's final/ or checkpoint), hub id or `tiny`
    config: Path | None = None  # the run's config.yaml
    run: Path | None = None  # the run's folder (summary.json)


def locate(model: str) -> Target:
    """A run's folder means its final/; final/, final-merged/ and checkpoints evaluate with the run's config."""
    folder = Path(model)
    if not folder.is_dir():
        return Target(model)
    if (folder / "config.yaml").is_file() and not (folder / "config.json").is_file():  # a run's folder: no weights of its own
        if not (folder / "final").is_dir():
            last = latest_checkpoint(folder / "checkpoints")
            hint = f"evaluate its newest checkpoint: rlvr eval {last}" if last else "it has no checkpoint either"
            raise ConfigError(f"rlvr eval {model}: the run has no final/ model (it has not finished); {hint}")
        return Target(str(folder / "final"), folder / "config.yaml", folder)
    if folder.name in ("final", "final-merged") and (folder.parent / "config.yaml").is_file():
        return Target(model, folder.parent / "config.yaml", folder.parent)
    if (folder / "config.yaml").is_file() and (folder / "trainer_state.pt").is_file():  # runs/<run>/checkpoints/step-N
        return Target(model, folder / "config.yaml", folder.parent.parent)
    return Target(model)


def eval_config(target: Target, args) -> Config:
    """The run's config (defaults for any other model), with the command line's system prompt and tools.* settings."""
    overrides = tool_overrides(args)
    if target.config is not None:  # a run written before a field existed is evaluated as it ran
        overrides = old_run_overrides(yaml.safe_load(target.config.read_text()) or {}) + overrides
    try:
        cfg = load_config(target.config, overrides)
    except ConfigError as e:
        raise ConfigError(f"rlvr eval: {e}") from None
    if args.task is not None and not cfg.tools.enabled and args.task in TASKS:
        task_tools = get_task(args.task, seed=0).tools  # a tool task is played with its tools, unless tools are set
        if task_tools:
            cfg = load_config(target.config, [f"tools.{k}={json.dumps(v)}" for k, v in task_tools.items()] + overrides)
    if args.system_prompt is not None:
        cfg.data.system_prompt = args.system_prompt or None
    if getattr(args, "agent", None):
        cfg.rollout.agent = args.agent
        # the agent runs its own tools: a tool run's (or task's) functions go, its tag format stays for the endpoint
        cfg.tools.functions, cfg.tools.max_turns = [], type(cfg.tools)().max_turns
    if getattr(args, "agent_timeout", None):
        cfg.rollout.agent_timeout = args.agent_timeout
    if getattr(args, "samples", None) is not None:
        cfg.eval.samples = args.samples
    if getattr(args, "temperature", None) is not None:
        cfg.eval.temperature = args.temperature
    # a misspelt tool format or tag names its key, with a suggestion; force: a run trained with --force is evaluated as it is
    check_config(cfg, force=True)
    return cfg


def tool_overrides(args) -> list[str]:
    """`tools.KEY=VALUE` overrides from the tool flags and the positional overrides (tools.* keys only)."""
    out = []
    for flag, key in TOOL_FLAGS.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        if key in ("functions", "tags"):  # repeatable and comma-separated
            value = [v.strip() for item in value for v in item.split(",") if v.strip()]
        out.append(f"tools.{key}={json.dumps(value)}")
    for item in getattr(args, "overrides", []):
        if not item.split("=", 1)[0].strip().startswith("tools."):
            raise ConfigError(
                f"rlvr eval: `{item}`: only tools.* settings can be overridden here (e.g. tools.timeout_s=5); "
                "the other flags set what is evaluated (rlvr eval --help)"
            )
        out.append(item)
    return out


def held_out(args, cfg: Config, target: Target) -> tuple[HeldOut, Task | None]:
    """The held-out set the command line names (--data / --task), else the run's own, else arithmetic's."""
    if args.data is not None:
        if args.task is not None:
            raise ConfigError("rlvr eval: give --task (a built-in task) or --data (a dataset), not both")
        return _dataset(args, cfg, target), None
    if args.task is not None and args.task not in TASKS:
        raise ConfigError(f"rlvr eval --task {args.task}: unknown task; built-in tasks: {', '.join(TASKS)}")
    if target.config is not None and args.task is None:
        return _runs_own(args, cfg, target)
    d = cfg.data
    own = target.config is not None and args.task == d.builtin_task  # the run's task: its settings and size
    task = get_task(
        args.task or "arithmetic",
        seed=cfg.seed if own else 0,
        digits=_pick(args.digits, d.digits, own, 2),
        operators=_pick(args.operators, d.operators, own, "+-"),
        eval_size=args.n or (d.eval_size if own else 500),
    )
    return weighing_all(task_held_out(task, args.reward or (cfg.eval.reward if own else None)), cfg), task


def _runs_own(args, cfg: Config, target: Target) -> tuple[HeldOut, Task | None]:
    """The run's held-out set as its trainer built it (rlvr.training.evaluation.held_out_for), with the flags given."""
    d, e = cfg.data, cfg.eval
    d.digits, d.operators = _pick(args.digits, d.digits, True, 2), _pick(args.operators, d.operators, True, "+-")
    d.eval_size, e.size = (args.n, args.n) if args.n else (d.eval_size, e.size)
    e.reward, e.prompt_column = args.reward or e.reward, args.prompt_column or e.prompt_column
    task = None
    if d.builtin_task:
        task = get_task(d.builtin_task, seed=cfg.seed, digits=d.digits, operators=d.operators, eval_size=d.eval_size)
    held = held_out_for(cfg, task)
    if held is None:
        raise ConfigError(
            f"rlvr eval {target.run}: the run has no held-out set (a data.path run without eval.data): give --data FILE --reward FN"
        )
    return held, task


def _pick(flag, run_value, own: bool, default):
    """A task setting: the flag, else the run's (evaluating the run's own task), else the default."""
    return flag if flag is not None else run_value if own else default


def _dataset(args, cfg: Config, target: Target) -> HeldOut:
    """--data FILE, scored by --reward, else (a run) its eval.reward or first reward, else an environment's get_reward()."""
    reward = args.reward
    if reward is None and target.config is not None:
        reward = cfg.eval.reward or (cfg.rewards[0].fn if cfg.rewards else None)
    if reward is None and cfg.tools.environment is None and not cfg.rollout.agent:
        raise ConfigError(
            "rlvr eval --data needs --reward: the reward whose mean is the score, e.g. --reward math or "
            "--reward my.py:correct (or an environment whose get_reward() scores: --environment file.py:Class)"
        )
    prompt_column = args.prompt_column or (cfg.data.prompt_column if target.config is not None else "prompt")
    held = dataset_held_out(
        args.data,
        reward=reward,
        prompt_column=prompt_column,
        split=args.split or "test",
        subset=args.subset,
        size=args.n or 0,
        environment=cfg.tools.environment,
        scorer="agent" if reward is None and cfg.rollout.agent else None,  # the reward the agent returns
    )
    return weighing_all(held, cfg)  # --reward all: the run's own rewards, weighted


def max_new_tokens(args, cfg: Config, target: Target, task: Task | None, room: int | None = None) -> int:
    """--max-new-tokens; a run's own held-out set: the run's rollout.max_new_tokens, as its trainer evaluated;
    otherwise the larger of the run's and what the task needs (a code-trained model on humaneval), else 256,
    at most `room` (what the model's context leaves after the longest prompt)."""
    if args.max_new_tokens:
        return args.max_new_tokens
    trained = cfg.rollout.max_new_tokens if target.config is not None else 0
    if target.config is not None and args.task is None and args.data is None:
        return trained
    wanted = max(trained, task.max_new_tokens if task is not None else 0) or 256
    return min(wanted, room) if room and room > 0 else wanted


def room_after_prompts(rows: list[dict], tokenizer, system_prompt: str | None, context_length: int | None) -> int | None:
    """Tokens the model's context leaves after the longest prompt (None: no known context)."""
    from rlvr.data import render_prompt

    if not context_length:
        return None
    longest = max(len(tokenizer(render_prompt(r["prompt"], tokenizer, system_prompt), add_special_tokens=False)["input_ids"]) for r in rows)
    return context_length - longest


def device_and_precision(cfg: Config, target: Target) -> tuple[torch.device, str]:
    """The device (cfg.device; auto: CUDA when available) and the autocast the run trained with (summary.json's
    resolved choice), else model.autocast as set (auto: bf16 on a CUDA GPU that supports it, none on the CPU)."""
    name = cfg.device if cfg.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    summary = target.run / "summary.json" if target.run is not None else None
    if summary is not None and summary.is_file():
        chosen = json.loads(summary.read_text()).get("precision", {}).get("autocast")
        if chosen in ("bf16", "none"):
            return device, chosen
    if cfg.model.autocast != "auto":
        return device, cfg.model.autocast
    return device, "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "none"


def describe(cfg: Config, target: Target) -> str:
    """One line saying how the model is evaluated: whose config, single- or multi-turn and with what."""
    t = cfg.tools
    whose = f"with {target.config}" if target.config is not None else "with rlvr's defaults"
    if cfg.rollout.agent:
        how = f"; tool calls in tags {', '.join(t.tags)}" if t.format == "tags" else ""
        return f"evaluating {target.model} {whose}: episodes run by rollout.agent {cfg.rollout.agent} (its own sampling settings{how})"
    if cfg.rollout.function:
        return f"evaluating {target.model} {whose}: episodes from rollout.function {cfg.rollout.function}"
    if not t.enabled:
        return f"evaluating {target.model} {whose}: single-turn"
    what = ([f"tools {', '.join(t.functions)}"] if t.functions else []) + ([f"environment {t.environment}"] if t.environment else [])
    return f"evaluating {target.model} {whose}: multi-turn with {' and '.join(what)} (tools.format={t.format}, max_turns={t.max_turns})"
