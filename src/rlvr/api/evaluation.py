"""`rlvr.evaluate(model, ...) -> EvalResult`: a model's held-out score from Python, what `rlvr eval MODEL ...`
computes (the CLI calls `evaluate` here and prints `EvalResult.lines()`).

MODEL is a model folder, a hub id or `tiny`, or a run (its folder, a `Run`, its final/ or a checkpoint),
which is evaluated the way it trained (rlvr.training.eval_command). The keywords are `rlvr eval`'s options.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlvr.api.run import Run
    from rlvr.training.evaluation import EvalOutcome, Interval

__all__ = ["EvalResult", "evaluate"]


@dataclass
class EvalResult:
    """A held-out score; with samples > 1 also pass@k, maj@k and avg@k, each with its 95 % interval in `intervals`."""

    score: float  # the mean reward (greedy), or avg@samples
    label: str  # what the number is: `accuracy` (a task's 0/1 verifier) or `mean <reward>`
    rows: int  # problems (a task) or rows (a dataset) evaluated
    samples: int  # episodes per row
    name: str  # the task's name, or the dataset as given
    how: str  # `greedy`, `temperature 1` (and the sampling filters on: `, top_p 0.9`), or the agent's sampling
    pass_at: dict[int, float] = field(default_factory=dict)  # k -> pass@k (a 0/1 reward and samples > 1)
    maj: float | None = None  # maj@samples, when the reward can compare answers
    avg: float | None = None  # avg@samples (samples > 1)
    failed: int = 0  # episodes the reward failed on (counted as 0)
    failure_note: str | None = None  # which reward failed how often, and its first error
    intervals: dict[str, Interval] = field(default_factory=dict)  # `pass@1`, `maj@8`, `avg@8` -> Interval(mean, low, high)
    what: str = field(default="rows", repr=False)  # `problems` (a task) or `rows`
    outcome: EvalOutcome | None = field(default=None, repr=False)  # rlvr.training.evaluation's own result

    def lines(self) -> list[str]:
        """What `rlvr eval` prints on stdout after its note: the intervals (samples > 1), then the score."""
        rows, what, k = self.rows, self.what, self.samples
        if k == 1:
            return [f"{self.name} held-out {self.label} ({rows} {what}, {self.how}): {self.score:.3f}"]
        out = [f"  {name:<8} {value}  (95% interval over {rows} {what})" for name, value in self.intervals.items()]
        if not self.pass_at and self.outcome is not None:
            out.append(f"[note] no pass@k: the reward {self.outcome.reward!r} is not 0/1 on every episode")
        out.append(f"{self.name} held-out {self.label} ({rows} {what}, {k} samples each, {self.how}): avg@{k} {self.score:.3f}")
        return out

    def __repr__(self) -> str:
        warning = [f"  warning: {self.failure_note}"] if self.failed else []
        return "\n".join([f"EvalResult(score={self.score:.3f})", *(f"  {line.strip()}" for line in self.lines()), *warning])


def evaluate(
    model: str | Path | Run,
    *,
    task: str | None = None,
    data: str | Path | None = None,
    reward: str | None = None,
    samples: int | None = None,
    temperature: float | None = None,
    max_new_tokens: int | None = None,
    n: int | None = None,
    prompt_column: str | None = None,
    split: str | None = None,
    subset: str | None = None,
    digits: int | None = None,
    operators: str | None = None,
    system_prompt: str | None = None,
    agent: str | None = None,
    agent_timeout: float | None = None,
    tools: str | Sequence[str] | None = None,
    environment: str | None = None,
    tool_format: str | None = None,
    tool_tags: Mapping[str, str] | Sequence[str] | None = None,
    tool_describe: bool | None = None,
    max_turns: int | None = None,
    overrides: Sequence[str] = (),
    quiet: bool = False,
) -> EvalResult:
    """The held-out score of `model`, as `rlvr eval MODEL --task ... --samples ...` computes it.

    Each keyword is the `rlvr eval` option of the same name (`n` is --n, `tools` is --tools, ...; None: the run's
    setting, else the default): `samples` > 1 samples at `temperature` and adds pass@k, maj@k and avg@k.
    `overrides`: `tools.KEY=VALUE` strings. Prints a one-line note on how the model is evaluated unless `quiet`.
    Raises ConfigError for a bad option and EvaluationError when the evaluation fails (never a score)."""
    from rlvr.training.eval_command import EvalOptions

    if hasattr(model, "output_dir"):  # a Run
        model = model.output_dir
    options = EvalOptions(
        task=task,
        data=None if data is None else str(data),
        reward=reward,
        prompt_column=prompt_column,
        split=split,
        subset=subset,
        n=n,
        digits=digits,
        operators=operators,
        max_new_tokens=max_new_tokens,
        samples=samples,
        temperature=temperature,
        system_prompt=system_prompt,
        agent=agent,
        agent_timeout=agent_timeout,
        tools=[tools] if isinstance(tools, str) else None if tools is None else list(tools),
        environment=environment,
        tool_format=tool_format,
        tool_tags=_tags(tool_tags),
        tool_describe=tool_describe,
        max_turns=max_turns,
        overrides=list(overrides),
    )
    return evaluate_options(str(model), options, quiet=quiet)


def _tags(tags: Mapping[str, str] | Sequence[str] | None) -> list[str] | None:
    """--tool-tags' `TOOL=TAG` strings from a mapping {tool: tag} or the strings themselves."""
    if tags is None:
        return None
    if isinstance(tags, Mapping):
        return [f"{tool}={tag}" for tool, tag in tags.items()]
    return [tags] if isinstance(tags, str) else list(tags)


def evaluate_options(model: str, args: Any, *, quiet: bool = False) -> EvalResult:
    """`rlvr eval MODEL` with its options (an EvalOptions): the config, the held-out set, the model, the score."""
    from rlvr.models.loading import load_model, load_tokenizer, resolve_existing, with_template_kwargs
    from rlvr.rollout import make_engine
    from rlvr.rollout.sources import make_source
    from rlvr.training import eval_command as ec
    from rlvr.training.setup import held_out_sampling

    target = ec.locate(model)
    cfg = ec.eval_config(target, args)
    held, task = ec.held_out(args, cfg, target)
    columns = frozenset({"environments"}) if cfg.tools.environment else None if cfg.rollout.function else frozenset()
    runner = held.runner(columns)  # data and reward mistakes before the model loads
    resolve_existing(target.model, what="rlvr eval MODEL")
    device, precision = ec.device_and_precision(cfg, target)
    m = cfg.model
    tok = with_template_kwargs(load_tokenizer(target.model, m.trust_remote_code)[0], cfg.data.chat_template_kwargs)
    loaded = load_model(target.model, m.dtype, device, m.trust_remote_code).eval()
    context = getattr(loaded.config, "max_position_embeddings", None)
    room = ec.room_after_prompts(held.rows, tok, cfg.data.system_prompt, context)  # a default length fits the model
    sampling = held_out_sampling(cfg, ec.max_new_tokens(args, cfg, target, task, room))
    # a run's prompts are checked against the context as its trainer checked them; any other model's are not (as before)
    source = make_source(
        cfg,
        make_engine("hf", loaded, tok),
        tok,
        sampling,
        device=device,
        precision=precision,
        context_length=context if target.config is not None else None,
    )
    if not quiet:
        print(f"[note] {ec.describe(cfg, target)}", flush=True)
    outcome = held.evaluate(source, runner)  # EvaluationError: never a score
    k = sampling.n
    how = "the agent's sampling" if cfg.rollout.agent else "greedy" if k == 1 else _sampling_words(sampling)
    intervals = {
        name: value
        for name, value in [*((f"pass@{j}", v) for j, v in outcome.pass_at.items()), (f"maj@{k}", outcome.maj), (f"avg@{k}", outcome.avg)]
        if value is not None
    }
    return EvalResult(
        score=outcome.score,
        label=held.label,
        rows=len(held.rows),
        samples=k,
        name=held.name,
        how=how,
        pass_at={j: v.mean for j, v in outcome.pass_at.items()},
        maj=outcome.maj.mean if outcome.maj is not None else None,
        avg=outcome.avg.mean if outcome.avg is not None else None,
        failed=outcome.failed,
        failure_note=outcome.failure_note() if outcome.failed else None,
        intervals=intervals,
        what="problems" if task is not None else "rows",
        outcome=outcome,
    )


def _sampling_words(sampling) -> str:
    """`temperature 0.8, top_p 0.9`: the temperature and each sampling filter that is on."""
    on = [("top_p", sampling.top_p, 1.0), ("top_k", sampling.top_k, 0), ("min_p", sampling.min_p, 0.0)]
    on.append(("repetition_penalty", sampling.repetition_penalty, 1.0))
    return ", ".join([f"temperature {sampling.temperature:g}", *(f"{name} {value:g}" for name, value, off in on if value != off)])
