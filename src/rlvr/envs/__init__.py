"""Built-in stateful environments for multi-turn rollouts (TRL's `environment_factory` contract).

An environment is a class built with no arguments, once per episode. `reset(**row)` receives the
dataset row's columns (the prompt included) and starts an episode; its public methods other than
`reset` and `get_reward` are the tools the model may call (their type hints and Google-style
docstrings become the tool schemas); `get_reward()` scores the finished episode.

`ENVIRONMENTS` maps the built-in names to `module:Class`, imported only when used. This package
imports nothing else of rlvr.
"""

ENVIRONMENTS = {
    "guess_number": "rlvr.envs.guess_number:GuessNumber",  # the `guess_number` task's game
}

__all__ = ["ENVIRONMENTS"]
