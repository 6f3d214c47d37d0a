"""Built-in rewards of the built-in tasks."""

from __future__ import annotations

from rlvr.data.arithmetic import is_correct
from rlvr.rewards.text import completion_text  # noqa: F401  (re-exported: users import it from here)


def arithmetic_correct(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion is exactly the integer in the `answer` column, else 0.0.

    >>> arithmetic_correct(["12+30="], ["42"], answer=["42"])
    [1.0]
    """
    return [float(is_correct(completion_text(c), a)) for c, a in zip(completions, answer)]
