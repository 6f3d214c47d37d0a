"""Marking reward factories, so config can name them with parameters.

A factory is a function that returns a reward function. In config, `fn: "overlong"` calls the
factory with its defaults and `fn: "overlong(max_length=512, buffer=128)"` with those keyword
arguments (Python literals). Plain reward functions take no parameters this way.
"""

from __future__ import annotations

from typing import Callable


def reward_factory(fn: Callable) -> Callable:
    """Decorator: `fn(**params)` builds a reward function."""
    setattr(fn, "is_reward_factory", True)  # noqa: B010 (mypy types no attributes on a Callable)
    return fn


def is_factory(fn: Callable) -> bool:
    return getattr(fn, "is_reward_factory", False) is True


def named(reward: Callable, name: str) -> Callable:
    """Give a built reward function the name its metrics use (`rewards/<name>/mean`)."""
    reward.__name__ = reward.__qualname__ = name
    return reward
