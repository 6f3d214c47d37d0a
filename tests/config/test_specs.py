"""rlvr.specs: the one resolver of `module:name` / `file.py:name(a=1)` config strings that rewards,
tools, environments and `rollout.function` share: parameters, the per-file module, and errors that
name the setting, the spec and the nearest name."""

from __future__ import annotations

import pytest

from rlvr.specs import SpecError, resolve, split_params


def test_split_params_reads_keyword_literals_only():
    assert split_params(" f.py:make(n=3, name='x', xs=[1, 2]) ", setting="reward") == ("f.py:make", {"n": 3, "name": "x", "xs": [1, 2]})
    assert split_params("math", setting="reward") == ("math", {})
    for bad in ("make(3)", "make(n=__import__('os'))", "make(n=)"):
        with pytest.raises(SpecError, match=r"^tools .make\(.*\).: parameters must be keyword=literal pairs"):
            split_params(bad, setting="tools")
    with pytest.raises(KeyError, match=r"rollout.function 'f\(1\)': parameters must be keyword=literal pairs"):
        split_params("f(1)", setting="rollout.function", error=KeyError)


def test_a_file_runs_once_per_version_and_specs_from_it_share_its_globals(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "state.py"
    src.write_text("calls = []\n\ndef add(x):\n    calls.append(x)\n    return len(calls)\n\ndef count():\n    return len(calls)\n")
    add = resolve("state.py:add", setting="tools")
    assert add(1) == 1 and resolve(f"{src}:count", setting="reward")() == 1  # relative and absolute: one module
    assert resolve("state.py:add", setting="tools") is add
    src.write_text("def add(x):\n    return -x\n")  # edited (another size, whatever the clock's resolution): run again
    assert resolve("state.py:add", setting="tools")(5) == -5


def test_errors_name_the_setting_the_spec_and_the_nearest_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "roll.py").write_text("def my_rollout(prompts):\n    pass\n\nclass Helper:\n    pass\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('bad module')\n")
    cases = [
        (
            dict(target="roll.py:my_rolout", setting="rollout.function"),
            r"^rollout.function 'roll.py:my_rolout': roll.py has no function 'my_rolout' \(did you mean 'my_rollout'\?\)$",
        ),
        (
            dict(target="roll.py:Helpr", setting="tool", what="function or class"),
            r"^tool 'roll.py:Helpr': roll.py has no function or class 'Helpr' \(did you mean 'Helper'\?\)$",
        ),
        (dict(target="roll.py:xyz", setting="rollout.function"), r"^rollout.function 'roll.py:xyz': roll.py has no function 'xyz'$"),
        (
            dict(target="my_rollout", setting="rollout.function"),
            r"^rollout.function 'my_rollout': use module:name or path/to/file.py:name$",
        ),
        (
            dict(target="calculater", spec="calculater(x=1)", setting="tool", builtins=["calculator", "python"]),
            r"^tool 'calculater\(x=1\)': use a built-in name \(calculator, python\), module:name or path/to/file.py:name "
            r"\(did you mean 'calculator'\?\)$",
        ),
        (
            dict(target="rol.py:f", setting="rollout.function"),
            rf"^rollout.function 'rol.py:f': file not found: rol.py \(relative to {tmp_path}\)$",
        ),
        (dict(target="broken.py:f", setting="reward"), r"^reward 'broken.py:f': importing broken.py failed: RuntimeError: bad module$"),
        (dict(target="no_such_mod:f", setting="reward"), r"^reward 'no_such_mod:f': cannot import module 'no_such_mod'"),
        (
            dict(target="os.path:jion", setting="reward"),
            r"^reward 'os.path:jion': os.path has no function 'jion' \(did you mean 'join'\?\)$",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(SpecError, match=message):
            resolve(**kwargs)
    with pytest.raises(LookupError, match="bad module"):  # the caller's own error class
        resolve("broken.py:f", setting="reward", error=LookupError)


def test_rewards_tools_environments_and_the_rollout_function_load_through_it(tmp_path, monkeypatch):
    from rlvr.rewards import RewardError, load_reward_fn
    from rlvr.rollout.sources.function import load_function
    from rlvr.tools import ToolError, load_tool
    from rlvr.tools.environments import load_environment

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(
        "def shout(text: str) -> str:\n    '''Shout.\n\n    Args:\n        text: What to shout.\n    '''\n    return text.upper()\n\n"
        "class Env:\n    def reset(self, **kw):\n        return None\n"
    )
    assert load_function("mine.py:shout") is load_tool("mine.py:shout").fn is load_reward_fn("mine.py:shout")
    assert load_environment("mine.py:Env") is load_environment(" mine.py:Env ")
    assert load_environment("guess_number").__name__ == "GuessNumber"  # the built-in name, as tools.environment takes it
    with pytest.raises(SpecError, match=r"^rollout.function 'mine.py:shuot': .* \(did you mean 'shout'\?\)$"):
        load_function("mine.py:shuot")
    with pytest.raises(ToolError, match=r"^tool 'mine.py:shuot': .* \(did you mean 'shout'\?\)$"):
        load_tool("mine.py:shuot")
    with pytest.raises(
        ToolError, match=r"^environment 'guess_numbr': use a built-in name \(guess_number\), .* \(did you mean 'guess_number'\?\)$"
    ):
        load_environment("guess_numbr")
    with pytest.raises(RewardError, match=r"^reward 'mine.py:shuot': .* \(did you mean 'shout'\?\)$"):
        load_reward_fn("mine.py:shuot")
