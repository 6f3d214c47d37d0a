"""How tools reach the model: `tools.format=auto` says which format it chose and why; the tags format
shows each tool (its JSON schema, as chat templates render `tools=`, and its tag call) in the system
prompt; `chat_template` is refused for a template that cannot render tools; tools.* settings that
name no tool are errors, and those that change nothing are warned about."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from transformers import LlamaForCausalLM

from _callers import HERMES_MINI, hermes_tokenizer, train_caller
from rlvr.config import ConfigError, load_config
from rlvr.models.build import char_llama_config
from rlvr.models.tokenizer import build_char_tokenizer
from rlvr.tools import ToolError, ToolSet
from rlvr.tools.chat_template import tools_problem
from rlvr.tools.environments import EnvironmentFactory
from rlvr.training.setup import check_config

ADD = '''
def add(a: int, b: int) -> int:
    """Add two integers exactly.

    Args:
        a: The first summand.
        b: The second summand.

    Returns:
        The sum.
    """
    return a + b
'''

# Qwen2.5-Instruct's chat template as published (its tools block verbatim), then plain turns.
QWEN25_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    '{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}'
    '\\n</tool_call><|im_end|>\\n" }}{%- endif %}'
    "{%- for m in messages %}{%- if m.role != 'system' %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
)


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """The project's char tokenizer (whose template renders no tools) on a random model with room for
    a description; a file tool `add`; rows with a text prompt and with a prompt bringing its own system message."""
    path = tmp_path_factory.mktemp("long_model")
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    LlamaForCausalLM(
        char_llama_config(tok, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, max_positions=2048)
    ).save_pretrained(path)
    tok.save_pretrained(path)
    (path / "tools.py").write_text(textwrap.dedent(ADD))
    rows = [
        {"prompt": "2+3=", "answer": "5", "target": 7},
        {"prompt": [{"role": "system", "content": "You add."}, {"role": "user", "content": "4+4="}], "answer": "8", "target": 9},
    ]
    (path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _tools_trainer(make_trainer, path, *overrides):
    return make_trainer(
        f"model.path={path}",
        "data.task=null",
        f"data.path={path / 'rows.jsonl'}",
        "data.shuffle=false",
        "rewards=[final_answer]",
        f"tools.functions=[calculator, {path / 'tools.py'}:add]",
        "tools.environment=guess_number",
        "tools.tags=[calculator=calc]",
        "data.system_prompt=Be brief.",
        "rollout.group_size=2",
        "rollout.prompts_per_step=2",
        *overrides,
    )


def _prompts_the_engine_receives(t) -> list[str]:
    seen, real = [], t.source.engine.generate_episodes

    def record(prompts, *args, **kwargs):
        seen.extend(prompts)
        return real(prompts, *args, **kwargs)

    t.source.engine.generate_episodes = record
    t.collector.collect(t.state)
    return seen


def test_tags_mode_shows_every_tool_in_the_system_prompt(make_trainer, long_model):
    t = _tools_trainer(make_trainer, long_model)
    prompts = _prompts_the_engine_receives(t)
    assert len(prompts) == 2
    schemas = ToolSet(["calculator", f"{long_model / 'tools.py'}:add"]).schemas + EnvironmentFactory("guess_number").schemas
    # the description is the block Qwen2.5's template renders from the schemas chat_template mode passes as tools=
    qwen = build_char_tokenizer()
    qwen.chat_template = QWEN25_TOOLS
    rendered = qwen.apply_chat_template([{"role": "user", "content": "q"}], tools=schemas, tokenize=False)
    block = rendered[rendered.index("# Tools") : rendered.rindex("</tools>") + len("</tools>")]
    calls = (
        "To call a function, write its arguments between its tags; the result comes back within <result></result>:\n"
        "calculator: <calc>expression</calc>\n"
        'add: <add>{"a": ..., "b": ...}</add>\n'
        "guess: <guess>number</guess>"
    )
    description = f"{block}\n\n{calls}"
    assert prompts[0] == f"<|system|>Be brief.\n\n{description}<|user|>2+3=<|assistant|>"
    assert prompts[1] == f"<|system|>You add.\n\n{description}<|user|>4+4=<|assistant|>"  # the row's own system prompt
    for name, what, params in [
        ("calculator", "Evaluate an arithmetic expression and return the result.", ["expression"]),
        ("add", "Add two integers exactly.", ["a", "b"]),
        ("guess", "Guess the secret number.", ["number"]),
    ]:
        assert f'"name": "{name}", "description": "{what}"' in prompts[0]
        assert all(f'"{p}": {{"type": "' in prompts[0] for p in params)
    assert '"a": {"type": "integer", "description": "The first summand."}' in prompts[0]


def test_describe_false_leaves_the_prompt_as_written(make_trainer, long_model):
    t = _tools_trainer(make_trainer, long_model, "tools.describe=false")
    assert _prompts_the_engine_receives(t) == [
        "<|system|>Be brief.<|user|>2+3=<|assistant|>",
        "<|system|>You add.<|user|>4+4=<|assistant|>",
    ]


def test_auto_says_it_chose_tags_and_why(rlvr_cli, long_model, tmp_path):
    out = rlvr_cli(
        "train",
        f"model.path={long_model}",
        "tools.functions=[calculator]",
        f"output_dir={tmp_path / 'run'}",
        "steps=1",
        "rollout.group_size=2",
        "rollout.prompts_per_step=1",
        "rollout.max_new_tokens=2",
        "eval_before_after=false",
        "threads=1",
        "report_to=[]",
        "model.autocast=none",
        check=True,
        timeout=300,
    )
    note = (
        f"[note] tools.format=auto -> tags: the chat template of {long_model} cannot render tools= (it ignores the tools "
        "argument: the prompt is the same with and without tools); the tools are described in the system prompt and "
        "called as <tag>input</tag>\n"
    )
    assert out.stdout.count(note) == 1, out.stdout


@pytest.fixture(scope="module")
def hermes_model(tmp_path_factory):
    tok = hermes_tokenizer()
    model, _ = train_caller(tok, [[("x", False), ("y", True)]], steps=1)
    path = tmp_path_factory.mktemp("hermes_model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_auto_says_it_chose_the_chat_template_and_warns_of_tag_settings(make_trainer, hermes_model):
    t = make_trainer(
        f"model.path={hermes_model}",
        "tools.functions=[calculator]",
        "tools.tags=[calculator=calc]",
        "tools.describe=false",
        "tools.result_tags=[<r>, </r>]",
    )
    why = "with tools.format=auto (which chose chat_template)"
    assert t.warnings[-4:] == [
        f"tools.format=auto -> chat_template: the chat template of {hermes_model} renders tools= and tool calls "
        "(its own call format, results as role: tool messages)",
        f"tools.tags has no effect {why}: the model calls tools in its chat template's format",
        f"tools.result_tags has no effect {why}: the model calls tools in its chat template's format",
        f"tools.describe=false has no effect {why}: the chat template shows the tools itself",
    ]
    explicit = make_trainer(f"model.path={hermes_model}", "tools.functions=[calculator]", "tools.format=chat_template", run="explicit")
    assert not [w for w in explicit.warnings if "tools" in w]  # a chosen format is not announced


def test_chat_template_is_refused_for_a_template_that_cannot_render_tools(rlvr_cli, tmp_path):
    out = rlvr_cli(
        "train",
        "model.path=tiny",
        "tools.functions=[calculator]",
        "tools.format=chat_template",
        f"output_dir={tmp_path / 'run'}",
        "steps=1",
        "report_to=[]",
        "threads=1",
        timeout=300,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "rlvr: error: `tools.format=chat_template`: the chat template of tiny cannot render tools= (it ignores the tools argument: "
        "the prompt is the same with and without tools), so the model would be offered no tools: set tools.format=tags (the tools "
        "are then described in the system prompt and called as <tag>input</tag>), or tools.format=auto, which chooses tags for this model"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


DROPS_CALLS = HERMES_MINI.replace("{{- c.function.arguments | tojson }}", "{{- '{}' }}")
NO_TOOL_ROLE = HERMES_MINI.replace("{%- elif m.role == 'tool' %}", "{%- elif m.role == 'tool' %}{{ raise_exception('no tool role') }}")


@pytest.mark.parametrize(
    "template, problem",
    [
        (HERMES_MINI, None),
        (DROPS_CALLS, "it drops the tool call's arguments"),
        (HERMES_MINI.replace("m.content + '</tool_response>", "'</tool_response>"), "it drops the tool message's content"),
        (NO_TOOL_ROLE, "it fails on a tool call and its result (TemplateError: no tool role)"),
        (HERMES_MINI.replace("' ' + t.function.name", "' tool'"), "it does not show the tools' names"),
    ],
)
def test_what_a_template_cannot_do_with_tools_is_named(template, problem):
    assert tools_problem(hermes_tokenizer(template)) == problem


def test_a_template_that_drops_tool_calls_is_refused_by_name(make_trainer, tmp_path):
    tok = hermes_tokenizer(DROPS_CALLS)
    model, _ = train_caller(tok, [[("x", False), ("y", True)]], steps=1)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    with pytest.raises(
        ToolError,
        match=r"^`tools.format=chat_template`: the chat template of .*/m cannot render tools= "
        r"\(it drops the tool call's arguments\), so the model would be offered no tools",
    ):
        make_trainer(f"model.path={tmp_path / 'm'}", "tools.functions=[calculator]", "tools.format=chat_template")


def test_tags_naming_a_tool_that_does_not_exist_is_an_error(rlvr_cli, tmp_path):
    out = rlvr_cli(
        "train",
        "model.path=tiny",
        "tools.functions=[calculator]",
        "tools.tags=[calculater=calc]",
        f"output_dir={tmp_path / 'run'}",
        "steps=1",
        "report_to=[]",
        "threads=1",
        timeout=300,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "rlvr: error: `tools.tags` names a tool this run does not have: calculater=calc (did you mean 'calculator'?); "
        "its tools are calculator"
    )


def test_tags_are_checked_against_the_environment_tools_too(make_trainer):
    with pytest.raises(
        ConfigError,
        match=r"^`tools.tags` names tools this run does not have: gues=g \(did you mean 'guess'\?\); "
        r"zzz=z; its tools are calculator, guess$",
    ):
        make_trainer("tools.functions=[calculator]", "tools.environment=guess_number", "tools.tags=[gues=g, zzz=z, calculator=calc]")


def test_tools_settings_without_tools_are_warned_about():
    warnings = check_config(
        load_config(None, ["tools.format=tags", "tools.tags=[calculator=calc]", "tools.timeout_s=3", "tools.describe=false"])
    )
    assert [w for w in warnings if w.startswith("tools.")] == [
        f"tools.{k} has no effect without tools (tools.functions or tools.environment)" for k in ("format", "tags", "describe", "timeout_s")
    ]
    one_turn = check_config(load_config(None, ["tools.functions=[calculator]", "tools.max_turns=1"]))
    assert [w for w in one_turn if w.startswith("tools.")] == [
        "tools.max_turns=1: a call made in the last turn is not run, so no tool ever runs; set it to 2 or more"
    ]
    assert not [w for w in check_config(load_config(None, ["tools.functions=[calculator]"])) if w.startswith("tools.")]


def test_a_description_too_long_for_the_model_names_tools_describe(make_trainer):
    t = make_trainer("model.path=tiny", "tools.functions=[calculator]", "rollout.max_new_tokens=8")
    with pytest.raises(
        ValueError,
        match=r"does not fit the model's context of 128 tokens.*; \d+ of its tokens are the tools' "
        r"description in the system prompt: set tools.describe=false",
    ):
        t.collector.collect(t.state)
