"""rlvr.tools: tools and environments by spec (TRL's contract), running calls under deadlines,
the built-in calculator and python session, the tag and Hermes call formats, and the glue text
between turns computed from a Hermes/Qwen-style chat template (built locally, nothing downloaded)."""

from __future__ import annotations

import asyncio
import string
import threading
import time

from dataclasses import replace

import pytest

from rlvr.tools import (
    EnvironmentFactory,
    HermesFormat,
    PythonSession,
    TagFormat,
    ToolCall,
    ToolError,
    ToolResult,
    ToolRunner,
    ToolSet,
    calculator,
    check_prefix_preserving,
    environment_tools,
    glue_after_turn,
    load_environment,
    load_tool,
    make_tool,
    template_supports_tools,
)

# ------------------------------------------------------------------------------ tools to call


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum.
    """
    return a + b


def square(n: int) -> int:
    """Square an integer.

    Args:
        n: The integer.
    """
    return n * n


def scale(x: float, times: int | None = None, loud: bool = False) -> str:
    """Scale a number.

    Args:
        x: The number.
        times: How many times (default 2).
        loud: Shout the result.
    """
    out = str(x * (2 if times is None else times))
    return out.upper() + "!" if loud else out


def slow(x: int) -> str:
    """Sleep half a second, then echo.

    Args:
        x: A number.
    """
    time.sleep(0.5)
    return str(x)


async def aslow(x: int) -> str:
    """Sleep half a second without blocking, then echo.

    Args:
        x: A number.
    """
    await asyncio.sleep(0.5)
    return f"a{x}"


def boom(x: int) -> str:
    """Always fails.

    Args:
        x: Ignored.
    """
    raise ZeroDivisionError("division by zero")


def nothing(x: int) -> str:
    """Returns None by mistake.

    Args:
        x: Ignored.
    """
    return None


def thing(x: int) -> str:
    """Returns an object by mistake.

    Args:
        x: Ignored.
    """
    return object()


def data(x: int) -> dict:
    """Returns structured data.

    Args:
        x: A number.
    """
    return {"x": x, "items": [1, 2]}


def long_text(n: int) -> str:
    """Returns n characters.

    Args:
        n: How many.
    """
    return "a" * n


def tools_of(*fns) -> dict:
    return {t.name: t for t in map(make_tool, fns)}


# ------------------------------------------------------------------------------ registry


def test_schema_comes_from_hints_and_google_docstring():
    t = make_tool(add)
    assert t.schema == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first integer."},
                    "b": {"type": "integer", "description": "The second integer."},
                },
                "required": ["a", "b"],
            },
            "return": {"type": "integer", "description": "The sum."},
        },
    }
    assert (t.name, t.params, t.types, t.required, t.is_async) == ("add", ["a", "b"], {"a": int, "b": int}, ["a", "b"], False)
    assert make_tool(aslow).is_async


def test_missing_hints_or_docstring_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text(
        "def nohint(x):\n    '''Doc.\n\n    Args:\n        x: an x\n    '''\n\n"
        "def nodoc(x: int) -> int:\n    return x\n\n"
        "def noargs(x: int) -> int:\n    '''Only a summary.'''\n"
    )
    with pytest.raises(ToolError, match=r"tool 'bad.py:nohint' \(nohint\): cannot build its schema: .*missing a type hint"):
        load_tool("bad.py:nohint")
    with pytest.raises(ToolError, match=r"bad.py:nodoc.*no docstring.*Google-style docstring"):
        load_tool("bad.py:nodoc")
    with pytest.raises(ToolError, match=r"bad.py:noargs.*no description for the argument 'x'"):
        load_tool("bad.py:noargs")


def test_load_tool_builtin_module_and_file(tmp_path, monkeypatch):
    assert load_tool("calculator").fn is calculator
    py = load_tool("python")
    assert py.name == "python" and isinstance(py.fn.__self__, PythonSession) and py.params == ["code"]
    assert py.schema["function"]["description"].startswith("Run Python code and return what it prints.")
    assert load_tool("rlvr.tools.builtin:calculator").fn is calculator
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mytools.py").write_text(
        "def shout(text: str) -> str:\n    '''Shout.\n\n    Args:\n        text: What to shout.\n    '''\n    return text.upper()\n"
    )
    tool = load_tool("mytools.py:shout")
    assert tool.name == "shout" and tool.fn("hi") == "HI"


def test_load_tool_errors_name_the_spec_and_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ToolError, match=r"tool 'calc': use a built-in name \(calculator, python\), module:name"):
        load_tool("calc")
    with pytest.raises(ToolError, match=r"tool 'nope.py:f': file not found: nope.py \(relative to "):
        load_tool("nope.py:f")
    with pytest.raises(ToolError, match=r"tool 'no_such_mod:f': cannot import module 'no_such_mod'"):
        load_tool("no_such_mod:f")
    with pytest.raises(ToolError, match=r"tool 'rlvr.tools:nope': rlvr.tools has no function or class 'nope'"):
        load_tool("rlvr.tools:nope")
    (tmp_path / "broken.py").write_text("raise RuntimeError('bad module')\n")
    with pytest.raises(ToolError, match=r"importing broken.py failed: RuntimeError: bad module"):
        load_tool("broken.py:f")
    with pytest.raises(ToolError, match=r"calculator is a function and takes no parameters"):
        load_tool("calculator(x=1)")


def test_toolset_shares_functions_and_gives_each_episode_its_own_session():
    ts = ToolSet(["calculator", "python(timeout_s=3)", add])
    assert ts.names == ["calculator", "python", "add"]
    assert [s["function"]["name"] for s in ts.schemas] == ts.names
    one, two = ts.for_episode(), ts.for_episode()
    assert list(one) == ts.names
    assert one["calculator"] is two["calculator"] and one["add"] is two["add"]
    assert one["python"].fn.__self__ is not two["python"].fn.__self__
    assert one["python"].fn.__self__.timeout_s == 3
    with pytest.raises(ToolError, match=r"a tool named 'calculator' is already defined"):
        ToolSet(["calculator", "rlvr.tools.builtin:calculator"])
    with pytest.raises(ToolError, match=r"tool 'python\(nope=1\)': PythonSession\(nope=1\) failed: TypeError"):
        ToolSet(["python(nope=1)"])


# ------------------------------------------------------------------------------ environments

# The shape TRL documents for `environment_factory` (docs/source/grpo_trainer.md, "Environments"):
# reserved reset/get_reward, public methods with hints and Google docstrings are the tools.
TRL_STYLE_ENV = '''
import random


class CounterEnv:
    def __init__(self):
        self.counter = 0
        self.target = 0

    # Reserved methods
    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        self.target = kwargs.get("target", random.randint(1, 6))
        return f"Increment the counter to {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter

    def read(self) -> int:
        """
        Read the internal counter.

        Returns:
            The current counter value.
        """
        return self.counter

    @property
    def finished(self) -> bool:
        raise AssertionError("properties are not tools and must not be evaluated")

    def _helper(self) -> None:
        pass


class NoKwargsEnv:
    def reset(self, target) -> None:
        self.target = target

    async def get_reward(self) -> float:
        return 0.5
'''


def test_trl_style_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "envs.py").write_text(TRL_STYLE_ENV)
    cls = load_environment("envs.py:CounterEnv")
    assert cls.__name__ == "CounterEnv"
    factory = EnvironmentFactory("envs.py:CounterEnv")
    assert factory.names == ["increment", "read"] and factory.has_reward
    assert factory.schemas[0]["function"] == {
        "name": "increment",
        "description": "Increment the internal counter.",
        "parameters": {
            "type": "object",
            "properties": {"step": {"type": "integer", "description": "Value to add to the counter."}},
            "required": ["step"],
        },
        "return": {"type": "integer", "description": "The updated counter value."},
    }
    a, b = factory.new(), factory.new()
    assert a is not b
    assert factory.reset(a, {"target": 3, "prompt": "ignored"}) == "Increment the counter to 3."
    factory.reset(b, {"target": 5})
    tools_a, tools_b = factory.tools(a), environment_tools(b)
    assert list(tools_a) == ["increment", "read"]
    # the first instance's tools bound to this one (their schemas built once): what environment_tools builds for it
    assert all(tools_a[n].fn.__self__ is a and tools_a[n] == replace(t, fn=tools_a[n].fn) for n, t in environment_tools(a).items())
    with ToolRunner(timeout_s=2) as runner:
        assert runner.run([ToolCall("increment", {"step": 2}, "")], tools_a)[0].text == "2"
        assert runner.run([ToolCall("increment", "1", "")], tools_a)[0].text == "3"
        assert runner.run([ToolCall("read", {}, "")], tools_b)[0].text == "0"
        assert runner.run([ToolCall("reset", {}, "")], tools_a)[0].error == "unknown_tool"
    assert factory.get_reward(a) == 1.0 and factory.get_reward(b) == 0.0

    other = EnvironmentFactory("envs.py:NoKwargsEnv")  # reset gets only the columns it names
    env = other.new()
    assert other.reset(env, {"target": 7, "prompt": "p"}) is None and env.target == 7
    assert other.names == [] and other.has_reward and other.get_reward(env) == 0.5


def test_environment_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "envs.py").write_text("class NoReset:\n    pass\n\nclass BadReset:\n    def reset(self, **kw):\n        return 3\n")
    with pytest.raises(ToolError, match=r"environment 'envs.py:NoReset': class NoReset has no reset"):
        load_environment("envs.py:NoReset")
    with pytest.raises(ToolError, match=r"environment 'envs.py:Missing': envs.py has no function or class 'Missing'"):
        EnvironmentFactory("envs.py:Missing")
    bad = EnvironmentFactory("envs.py:BadReset")
    with pytest.raises(ToolError, match=r"BadReset: reset\(\) returned int; it must return a string or None"):
        bad.reset(bad.new(), {})


# ------------------------------------------------------------------------------ running calls


def test_calls_bind_convert_and_format():
    tools = tools_of(add, square, scale, data, calculator)
    calls = [
        ToolCall("add", {"a": 2, "b": "3"}, ""),  # "3" -> 3 is lossless
        ToolCall("square", " 7 ", ""),  # raw text binds to the single parameter
        ToolCall("add", '{"a": 1, "b": 2.0}', ""),  # several parameters: a JSON object
        ToolCall("scale", {"x": "1.5", "loud": "true"}, ""),
        ToolCall("scale", {"x": 2, "times": None}, ""),
        ToolCall("scale", "3", ""),  # one required parameter: plain text binds to it
        ToolCall("data", {"x": 1}, ""),
        ToolCall("calculator", "12*34", ""),
    ]
    with ToolRunner(timeout_s=2) as runner:
        results = runner.run(calls, tools)
    assert [r.text for r in results] == ["5", "49", "3", "3.0!", "4.0", "6.0", '{"x": 1, "items": [1, 2]}', "408"]
    assert all(r.ok and r.error is None and r.seconds >= 0 for r in results)
    assert [r.name for r in results] == [c.name for c in calls]


def test_every_failure_is_a_message_naming_the_tool():
    tools = tools_of(add, square, boom, nothing, thing, long_text, calculator)
    cases = [
        (
            ToolCall("calc", "1+1", ""),
            "unknown_tool",
            "error: tool 'calc' is not available; tools: add, square, boom, nothing, thing, long_text, calculator",
        ),
        (ToolCall("square", "abc", ""), "bad_arguments", "error: bad arguments for square: argument 'n' must be an integer, got \"abc\""),
        (ToolCall("square", "2.5", ""), "bad_arguments", "error: bad arguments for square: argument 'n' must be an integer, got \"2.5\""),
        (ToolCall("add", {"a": 1, "c": 2}, ""), "bad_arguments", "error: bad arguments for add: unexpected argument 'c'; expected a, b"),
        (ToolCall("add", {"a": 1}, ""), "bad_arguments", "error: bad arguments for add: missing argument 'b'"),
        (ToolCall("add", "1, 2", ""), "bad_arguments", "error: bad arguments for add: expected a JSON object with a, b"),
        (
            ToolCall("add", {"a": True, "b": 1}, ""),
            "bad_arguments",
            "error: bad arguments for add: argument 'a' must be an integer, got true",
        ),
        (ToolCall("boom", {"x": 1}, ""), "raised", "error: boom raised ZeroDivisionError: division by zero"),
        (ToolCall("calculator", "1/0", ""), "raised", "error: calculator raised ZeroDivisionError: division by zero"),
        (ToolCall("nothing", {"x": 1}, ""), "not_a_string", "error: nothing returned None, not a string"),
        (ToolCall("thing", {"x": 1}, ""), "not_a_string", "error: thing returned a value of type object, not a string"),
    ]
    with ToolRunner(timeout_s=2, max_result_chars=10) as runner:
        results = runner.run([c for c, _, _ in cases], tools)
        truncated = runner.run([ToolCall("long_text", {"n": 25}, "")], tools)[0]
    for (call, error, text), r in zip(cases, results):
        assert (r.ok, r.error, r.name) == (False, error, call.name)
        assert r.text == text[:10] + f"...[truncated {len(text) - 10} chars]" if len(text) > 10 else r.text == text
    assert truncated.ok and truncated.error is None and truncated.text == "aaaaaaaaaa...[truncated 15 chars]"
    with ToolRunner(timeout_s=2) as runner:  # and in full, uncapped
        full = runner.run([c for c, _, _ in cases], tools)
    assert [r.text for r in full] == [t for _, _, t in cases]


def test_sync_and_async_calls_run_concurrently():
    tools = tools_of(slow, aslow)
    with ToolRunner(timeout_s=3) as runner:
        t0 = time.monotonic()
        pending = [runner.submit(ToolCall("slow", {"x": i}, ""), tools) for i in range(8)]
        assert time.monotonic() - t0 < 0.2  # submit returns at once
        assert [p.result().text for p in pending] == [str(i) for i in range(8)]
        assert time.monotonic() - t0 < 1.5
        t0 = time.monotonic()
        pending = [runner.submit(ToolCall("aslow", {"x": i}, ""), tools) for i in range(8)]
        assert [p.result().text for p in pending] == [f"a{i}" for i in range(8)]
        assert time.monotonic() - t0 < 1.5


def test_wait_any_returns_as_soon_as_one_is_done():
    def quick(x: int) -> str:
        """Quick.

        Args:
            x: A number.
        """
        return "q"

    tools = tools_of(slow, quick)
    with ToolRunner(timeout_s=3) as runner:
        slow_call = runner.submit(ToolCall("slow", {"x": 1}, ""), tools)
        assert runner.wait_any([slow_call], timeout=0.05) == [] and not slow_call.done()
        t0 = time.monotonic()
        quick_call = runner.submit(ToolCall("quick", {"x": 1}, ""), tools)
        assert runner.wait_any([slow_call, quick_call], timeout=2) == [quick_call]
        assert time.monotonic() - t0 < 0.3
        assert runner.wait_any([slow_call], timeout=2) == [slow_call] and slow_call.result().text == "1"


def test_a_hung_tool_is_cut_at_its_timeout_and_the_runner_keeps_working():
    release, cancelled = threading.Event(), threading.Event()

    def hang(x: int) -> str:
        """Never returns (until the test ends).

        Args:
            x: Ignored.
        """
        release.wait()
        return "late"

    async def ahang(x: int) -> str:
        """Never returns.

        Args:
            x: Ignored.
        """
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    tools = tools_of(hang, ahang, square)
    runner = ToolRunner(timeout_s=0.5, max_workers=1)  # one worker: the hung call must not hold it
    try:
        t0 = time.monotonic()
        hung = runner.submit(ToolCall("hang", {"x": 1}, ""), tools)
        ahung = runner.submit(ToolCall("ahang", {"x": 1}, ""), tools)
        assert runner.wait_any([hung, ahung], timeout=5) and time.monotonic() - t0 < 0.8
        for p, name in ((hung, "hang"), (ahung, "ahang")):
            r = p.result()
            assert (r.ok, r.error, r.text) == (False, "timeout", f"error: {name} timed out after 0.5s")
        assert time.monotonic() - t0 < 0.8
        assert cancelled.wait(1.0)  # the async one was cancelled
        t0 = time.monotonic()
        assert runner.run([ToolCall("square", "3", ""), ToolCall("square", "4", "")], tools)[1].text == "16"
        assert time.monotonic() - t0 < 0.3 and runner.abandoned == 1
    finally:
        release.set()
        runner.close()


def test_the_pool_grows_to_the_calls_a_batch_expects_unless_its_size_was_given():
    """40 calls that each wait for all 40 to be running (a barrier): they pass only if 40 run at once,
    past the 32 threads a runner starts with; a runner given max_workers keeps it."""
    n = 40
    barrier = threading.Barrier(n, timeout=20)

    def meet(x: int) -> str:
        """Wait until all calls run.

        Args:
            x: Ignored.
        """
        barrier.wait()
        return "met"

    with ToolRunner(timeout_s=30) as runner:
        assert runner.max_workers == 32 < n
        runner.expect(n)
        results = runner.run([ToolCall("meet", {"x": i}, "") for i in range(n)], tools_of(meet))
        assert [r.text for r in results] == ["met"] * n and runner.max_workers == n
        runner.expect(8)  # never shrinks
        assert runner.max_workers == n
    with ToolRunner(timeout_s=30, max_workers=4) as runner:
        runner.expect(n)
        assert runner.max_workers == 4


# ------------------------------------------------------------------------------ built-in tools


@pytest.mark.parametrize(
    "expression, value",
    [
        ("12*34", "408"),
        ("6/3", "2"),
        ("1/3", "0.3333333333333333"),
        ("0.1+0.2", "0.30000000000000004"),
        ("(2+3)**2/5", "5"),
        ("-(3+4)*2", "-14"),
        ("7//2", "3"),
        ("7%3", "1"),
        ("2**-2", "0.25"),
        ("2**100", "1267650600228229401496703205376"),
        (" 1.5e3 ", "1500"),
        ("1e20/1", "1e+20"),
        ("+-+5", "-5"),
    ],
)
def test_calculator(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize(
    "expression, message",
    [
        ("9**9**9", "the exponent 387420489 is too large (limit 1000)"),
        ("10**999*10**5", "the result has more than 1000 digits"),
        ("10.0**400", "the result is too large"),
        ("(-8)**(1/3)", "the result is not a real number"),
        ("x+1", "names are not allowed (found 'x'); use numbers and + - * / // % **"),
        ("__import__('os')", "function calls are not allowed; use numbers and + - * / // % **"),
        ("(1).real", "Attribute is not allowed; use numbers and + - * / // % **"),
        ("2^3", "the operator ^ (use ** for powers) is not supported"),
        ("'a'*3", "only numbers are allowed, not 'a'"),
        ("1+", "not an arithmetic expression: invalid syntax"),
    ],
)
def test_calculator_refuses_quickly(expression, message):
    t0 = time.monotonic()
    with pytest.raises(ValueError) as e:
        calculator(expression)
    assert str(e.value) == message and time.monotonic() - t0 < 0.5  # no huge number was built


def test_calculator_division_by_zero_raises():
    with pytest.raises(ZeroDivisionError):
        calculator("1/0")


def test_python_session_keeps_state_within_an_episode_only():
    one, two = PythonSession(timeout_s=5), PythonSession(timeout_s=5)
    assert one.python("x = 41\nprint('defined')") == "defined\n"
    assert one.python("print(x + 1)") == "42\n"  # earlier output is not repeated
    assert one.python("y = 1/0") == (
        'Traceback (most recent call last):\n  File "<cell>", line 1, in <module>\nZeroDivisionError: division by zero'
    )
    assert one.python("print(x, 'y' in dir())") == "41 False\n"  # the failed call left no state
    assert one.python("z = 1") == "(no output; print() what you want to see)"
    assert two.python("print(x)").endswith("NameError: name 'x' is not defined")


def test_python_session_timeout_and_output_cap():
    t0 = time.monotonic()
    assert PythonSession(timeout_s=1).python("while True:\n    pass") == "error: timeout: the code ran longer than 1s"
    assert time.monotonic() - t0 < 3
    assert PythonSession(max_output_chars=20).python("print('a' * 50)") == "a" * 20 + "...[truncated 31 chars]"
    # Long output before an error: the output is cut so that the error at the end survives.
    text = PythonSession(max_output_chars=200).python("print('b' * 500)\nraise KeyError('k')")
    assert len(text) <= 200 and text.startswith("bbb") and "...[truncated " in text and text.endswith("KeyError: 'k'")


def test_python_tool_through_the_runner():
    tools = ToolSet(["python"]).for_episode()
    with ToolRunner(timeout_s=10) as runner:
        assert runner.run([ToolCall("python", "n = 6", "")], tools)[0].ok
        assert runner.run([ToolCall("python", {"code": "print(n * 7)"}, "")], tools)[0].text == "42\n"


# ------------------------------------------------------------------------------ call formats


def test_tag_format():
    fmt = TagFormat({"calculator": "calc", "python": "python"})
    assert fmt.stop_strings == ["</calc>", "</python>"]
    (call,) = fmt.parse("Let me compute. <calc>12*34</calc>")
    assert (call.name, call.arguments, call.raw, call.error) == ("calculator", "12*34", "<calc>12*34</calc>", None)
    assert fmt.parse("<python>\nprint(1)\n</python>\n")[0].arguments == "\nprint(1)\n"
    assert fmt.parse("<calc>1</calc> so the answer is 1") == []  # the call must end the turn
    assert fmt.parse("<search>cats</search>") == []  # unknown tag
    assert fmt.parse("<calc>1+1") == [] and fmt.parse("1+1</calc>") == []  # unclosed / unopened
    assert fmt.parse("<calc>1</calc><calc>2+2</calc>")[0].arguments == "2+2"  # the one closing at the end
    ok = ToolResult("calculator", "408", True)
    bad = ToolResult("calculator", "error: calculator raised ZeroDivisionError: division by zero", False, "raised")
    assert fmt.result_text([ok]) == "<result>408</result>"
    assert fmt.result_text([bad]) == "<result>error: calculator raised ZeroDivisionError: division by zero</result>"
    assert TagFormat({"a": "t"}, "<out>", "</out>").result_text([ok]) == "<out>408</out>"
    schemas = ToolSet(["calculator", add]).schemas
    assert [fmt.call_example(schemas[0]), TagFormat({"add": "add"}).call_example(schemas[1])] == [
        "<calc>expression</calc>",
        '<add>{"a": ..., "b": ...}</add>',
    ]
    with pytest.raises(ToolError, match=r"tools 'a' and 'b' share the tag 'x'"):
        TagFormat({"a": "x", "b": "x"})
    with pytest.raises(ToolError, match=r"tag '</x>' must be a plain name"):
        TagFormat({"a": "</x>"})


def test_hermes_format_parses_calls_and_malformed_ones_become_one_error_each():
    fmt = HermesFormat()
    assert fmt.stop_strings == []
    turn = (
        'I will add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "square", "arguments": "{\\"n\\": 3}"}\n</tool_call>'
    )
    calls = fmt.parse(turn)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("add", {"a": 1, "b": 2}, None), ("square", {"n": 3}, None)]
    assert calls[0].raw == '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert fmt.parse("The answer is 3.") == []
    malformed = fmt.parse(
        '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>'
        "<tool_call>not json</tool_call>"
        '<tool_call>["add"]</tool_call>'
        '<tool_call>{"name": "square", "arguments": {"n": 2}}'
    )
    assert [(c.name, c.error) for c in malformed] == [
        ("add", "the tool call is not valid JSON (Expecting property name enclosed in double quotes)"),
        ("", "the tool call is not valid JSON (Expecting value)"),
        ("", 'expected {"name": "...", "arguments": {...}}'),
        ("square", "the tool call is missing </tool_call>"),
    ]
    with ToolRunner(timeout_s=2) as runner:
        results = runner.run(malformed, tools_of(add, square))
    assert [(r.error, r.text) for r in results] == [
        (
            "bad_arguments",
            "error: bad arguments for add: the tool call is not valid JSON (Expecting property name enclosed in double quotes)",
        ),
        ("bad_arguments", "error: could not read the tool call: the tool call is not valid JSON (Expecting value)"),
        ("bad_arguments", 'error: could not read the tool call: expected {"name": "...", "arguments": {...}}'),
        ("bad_arguments", "error: bad arguments for square: the tool call is missing </tool_call>"),
    ]
    assert fmt.result_messages(results[:1]) == [{"role": "tool", "name": "add", "content": results[0].text}]
    assert fmt.assistant_message(turn, calls) == {
        "role": "assistant",
        "content": "I will add.",
        "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
            {"type": "function", "function": {"name": "square", "arguments": {"n": 3}}},
        ],
    }


# ------------------------------------------------------------------------------ chat templates

# Structured like Qwen2.5-Instruct's template: tools listed in the system turn, tool calls as
# <tool_call> JSON, consecutive tool results grouped in one user turn as <tool_response>.
QWEN_LIKE = (
    "{%- if tools %}{{- '<|im_start|>system\\nYou are a helpful assistant.\\n\\n# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    '{{- \'\\n</tools>\\n\\nCall a function as <tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n'
    "</tool_call><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}{{- tool_call.arguments | tojson }}'
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Like Qwen3's: the last assistant turn gets an empty think block that earlier turns lose, so
# appending a tool message rewrites the turn before it.
DROPS_THINK = QWEN_LIKE.replace(
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}",
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if loop.last %}{{- '\\n<think>\\n\\n</think>' }}{%- endif %}",
)


def qwen_like_tokenizer(template: str):
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    chars = sorted(set(string.printable) - set("\r\x0b\x0c"))
    core = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(specials + chars)}, merges=[], unk_token="<unk>"))
    core.add_special_tokens(specials)
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=specials[:2],
        chat_template=template,
    )


def test_template_supports_tools():
    from rlvr.models.tokenizer import build_char_tokenizer

    assert template_supports_tools(qwen_like_tokenizer(QWEN_LIKE))
    assert not template_supports_tools(build_char_tokenizer())  # the project's own template has no tools


def test_prefix_preserving_check():
    schemas = ToolSet(["calculator"]).schemas
    check_prefix_preserving(qwen_like_tokenizer(QWEN_LIKE), schemas)
    with pytest.raises(
        ToolError,
        match=r"not prefix-preserving: appending a tool result rewrites the text before it "
        r"\(at character \d+: .*use `tools.format=tags`",
    ):
        check_prefix_preserving(qwen_like_tokenizer(DROPS_THINK), schemas)
    no_eot = qwen_like_tokenizer("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    with pytest.raises(ToolError, match=r"does not end an assistant turn with '<\|im_end\|>'.*pass end_of_turn="):
        check_prefix_preserving(no_eot, schemas)


def test_glue_after_turn_reproduces_the_template_rendering():
    tok = qwen_like_tokenizer(QWEN_LIKE)
    schemas = ToolSet(["calculator", add]).schemas
    fmt = HermesFormat()
    messages = [{"role": "user", "content": "What is 12*34 + 1?"}]
    context = tok.apply_chat_template(messages, tools=schemas, add_generation_prompt=True, tokenize=False)
    sampled = [  # what the model writes in each turn, ending with the EOS it sampled
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call><|im_end|>',
        '<tool_call>\n{"name": "add", "arguments": {"a": 408, "b": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "408+1"}}\n</tool_call><|im_end|>',
    ]
    tools = {t.name: t for t in map(make_tool, (calculator, add))}
    with ToolRunner(timeout_s=2) as runner:
        for turn in sampled:
            calls = fmt.parse(turn)
            messages.append(fmt.assistant_message(turn, calls))
            results = fmt.result_messages(runner.run(calls, tools))
            glue = glue_after_turn(tok, messages, schemas, results)
            messages += results
            context += turn + glue
            full = tok.apply_chat_template(messages, tools=schemas, add_generation_prompt=True, tokenize=False)
            assert context == full
            assert glue.startswith("\n<|im_start|>user\n<tool_response>\n") and glue.endswith("<|im_start|>assistant\n")
    assert glue == (
        "\n<|im_start|>user\n<tool_response>\n409\n</tool_response>\n<tool_response>\n409\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    # Tokenising the glue on its own gives the rendering's tokens: it starts right after a special token.
    full_ids = tok(full, add_special_tokens=False)["input_ids"]
    glue_ids = tok(glue, add_special_tokens=False)["input_ids"]
    assert full_ids[-len(glue_ids) :] == glue_ids
    with pytest.raises(ToolError, match="the last message must be the assistant turn"):
        glue_after_turn(tok, messages, schemas, [])
