"""Checks of data against what consumes it, made before any compute is spent."""

from __future__ import annotations

import inspect


# what every reward function is called with besides the dataset columns (TRL 1.16's contract; rlvr.rewards.runner)
TRL_REWARD_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra")


def check_reward_columns(reward_fns, row: dict, provided: frozenset[str] | None = frozenset()) -> None:
    """Every reward function's required keyword arguments must be dataset columns or columns the
    rollout provides (`provided`; None: the rollout may provide any, so nothing is checked)."""
    if provided is None:
        return
    given = {*TRL_REWARD_KEYWORDS, *row, *provided}
    for rf in reward_fns:
        for p in inspect.signature(rf.fn).parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and p.name not in given:
                if p.name == "environments":
                    raise ValueError(_no_environments(rf.name))
                cols = sorted(k for k in row if k != "prompt")
                raise ValueError(f"reward function {rf.name!r} needs a column {p.name!r}; the data has columns {cols}")


def _no_environments(name: str) -> str:
    """A reward that reads TRL's `environments` in a run without one: say so, and how an environment scores itself."""
    return (
        f"reward function {name!r} takes `environments` (the episodes' environment instances, as TRL passes them with "
        "environment_factory), but no environment is set: set tools.environment (rlvr eval: --environment) to your "
        "environment class (file.py:Class), or, with one, let it score itself with a get_reward(self) method (rlvr adds it as a reward "
        "named after the class, as TRL does) instead of a reward function"
    )


def check_prompt_lengths(prompts: list[str], tokenizer, context_length: int | None, max_new_tokens: int) -> None:
    """Each prompt plus max_new_tokens must fit the model's context."""
    if not context_length:
        return
    for p in prompts:
        n = len(tokenizer(p, add_special_tokens=False)["input_ids"])
        if n > context_length - max_new_tokens:
            raise ValueError(
                f"the prompt {p[:40]!r}... is {n} tokens; with rollout.max_new_tokens={max_new_tokens} "
                f"it does not fit the model's context of {context_length} tokens: shorten or filter it, or lower max_new_tokens"
            )
