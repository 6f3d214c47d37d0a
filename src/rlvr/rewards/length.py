"""Length rewards: DAPO's soft overlong punishment, and a plain length penalty.

Both count tokens from `completion_ids` (the trainer passes the token ids of each completion
as a keyword argument); `length_penalty` falls back to characters when called without them.

    >>> punish = overlong(max_length=10, buffer=4)
    >>> punish(None, ["a"] * 4, completion_ids=[[0] * 6, [0] * 8, [0] * 10, [0] * 12])
    [0.0, -0.5, -1.0, -1.0]
    >>> length_penalty(max_length=100)(None, ["x" * 50])
    [-0.5]

overlong (DAPO, Yu et al. 2025): 0 up to `max_length - buffer` tokens, then a linear penalty
reaching `-penalty` at `max_length` (and beyond). Set `max_length` to the rollout's
`max_new_tokens` so truncated completions get the full penalty. Config:
`fn: "overlong(max_length=1024, buffer=256)"`. length: `-scale * min(n, max_length) / max_length`.
"""

from __future__ import annotations

from rlvr.rewards.factory import named, reward_factory
from rlvr.rewards.text import completion_text


def _token_counts(completions, completion_ids, who: str) -> list[int]:
    if completion_ids is None:
        raise ValueError(f"{who} needs token counts: call it with completion_ids= (the trainer does)")
    if len(completion_ids) != len(completions):
        raise ValueError(f"{who}: {len(completion_ids)} completion_ids for {len(completions)} completions")
    return [len(ids) for ids in completion_ids]


@reward_factory
def overlong(max_length: int = 1024, buffer: int = 256, penalty: float = 1.0):
    """Build DAPO's soft overlong punishment."""
    if not 0 < buffer <= max_length:
        raise ValueError(f"overlong: need 0 < buffer <= max_length, got buffer={buffer}, max_length={max_length}")
    start = max_length - buffer

    def reward(prompts, completions, completion_ids=None, **kwargs):
        return [
            0.0 if n <= start else -penalty * min(1.0, (n - start) / buffer) for n in _token_counts(completions, completion_ids, "overlong")
        ]

    return named(reward, "overlong")


@reward_factory
def length_penalty(max_length: int = 1024, scale: float = 1.0):
    """Build a plain linear length penalty in [-scale, 0]."""
    if max_length <= 0:
        raise ValueError(f"length_penalty: max_length must be positive, got {max_length}")

    def reward(prompts, completions, completion_ids=None, **kwargs):
        if completion_ids is None:
            counts = [len(completion_text(c)) for c in completions]
        else:
            counts = _token_counts(completions, completion_ids, "length_penalty")
        return [-scale * min(n, max_length) / max_length for n in counts]

    return named(reward, "length")
