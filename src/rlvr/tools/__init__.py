"""Tools for multi-turn episodes: what a model may call, how its calls run, how it writes them.

Follows TRL's contract: a tool is a plain function (sync or async) with type hints and a
Google-style docstring; an environment (`environment_factory`) is a class, one instance per
episode, with `reset(**row)`, public methods as tools and optionally `get_reward()`.

    registry.py      Tool, load_tool, ToolSet (per-episode instances of stateful tools)
    environments.py  load_environment, EnvironmentFactory
    calling.py       ToolCall, ToolResult, ToolRunner (concurrent, every call bounded by a timeout)
    binding.py       arguments -> keyword arguments of the tool's annotated types
    pool.py          daemon worker threads and the event loop the runner uses
    builtin.py       calculator, PythonSession (the `python` tool, sandboxed)
    formats.py       TagFormat (<calc>..</calc> -> <result>..</result>, its tools described in the system prompt),
                     HermesFormat (<tool_call>{json})
    chat_template.py tools_problem / choose_format (tools.format), check_prefix_preserving, glue_after_turn

This package sits below `rollout` (which drives episodes with it) and uses only `sandbox`.
"""

from rlvr.tools.binding import BindError, bind, convert
from rlvr.tools.builtin import PythonSession, calculator
from rlvr.tools.calling import ERRORS, PendingCall, ToolCall, ToolResult, ToolRunner, to_text
from rlvr.tools.chat_template import check_prefix_preserving, choose_format, glue_after_turn, template_supports_tools, tools_problem
from rlvr.tools.environments import EnvironmentFactory, load_environment
from rlvr.tools.formats import HermesFormat, TagFormat
from rlvr.tools.registry import BUILTIN, Tool, ToolError, ToolSet, environment_tools, load_tool, make_tool

__all__ = [
    "Tool",
    "ToolError",
    "ToolSet",
    "load_tool",
    "make_tool",
    "environment_tools",
    "BUILTIN",
    "EnvironmentFactory",
    "load_environment",
    "ToolCall",
    "ToolResult",
    "ToolRunner",
    "PendingCall",
    "ERRORS",
    "to_text",
    "BindError",
    "bind",
    "convert",
    "calculator",
    "PythonSession",
    "TagFormat",
    "HermesFormat",
    "template_supports_tools",
    "tools_problem",
    "choose_format",
    "check_prefix_preserving",
    "glue_after_turn",
]
