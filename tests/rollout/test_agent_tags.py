"""examples/agent_openai.py, unchanged, trains the bundled tiny-tools model (which calls tools in tags) through the
endpoint: its calculator gets OpenAI tool calls, the results go back, and each episode is ONE training sequence
laid out as rlvr's `tools:` path lays out the same episode: the same prompt ids, the sampled ids trained,
`<result>..</result>` masked, the sampled ids of the rest of the turn."""

from __future__ import annotations

import json

import pytest
import torch

from _paths import REPO
from rlvr.config import load_config
from rlvr.rollout.engines.protocols import SamplingParams
from rlvr.rollout.sources import make_source
from rlvr.rollout.sources.multi_turn import _Driver

EXAMPLE = f"{REPO / 'examples' / 'agent_openai.py'}:calculator_agent"
ONE_TOKEN = SamplingParams(n=1, max_new_tokens=1)
TAGS = ["tools.format=tags", "tools.tags=[calculator=calc]", "tools.describe=false"]


def _tools_path(t):
    """The `tools:` source of the same model and tags (tools.functions=[calculator])."""
    cfg = load_config(None, ["model.path=tiny-tools", "data.task=multiplication", "tools.functions=[calculator]", *TAGS])
    return make_source(cfg, t.engine, t.tokenizer, t.source.sampling, context_length=None, device=torch.device("cpu"), precision="none")


def _row(e, r):
    attn, prompt = e.attention_mask[r].bool(), e.prompt_ids[r][e.prompt_mask[r].bool()].tolist()
    return prompt, e.completion_ids[r][attn].tolist(), e.loss_mask[r][attn].tolist()


def test_the_example_agent_trains_tiny_tools_in_tags_as_the_tools_path_would(make_trainer):
    t = make_trainer("model.path=tiny-tools", "data.task=multiplication", f"rollout.agent={EXAMPLE}", *TAGS, "rewards=[]", "steps=1",
                     "rollout.max_new_tokens=64", "rollout.prompts_per_step=4", "rollout.group_size=8", run="tags")  # fmt: skip
    t.train()
    m = json.loads((t.output_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert m["agent/error_frequency"] == 0 and m["agent/split_episodes"] == 0 and m["agent/tool_calls_per_episode"] > 0
    e, logs, tools, tok = t.last_step.batch.episodes, t.source.last_logs, _tools_path(t), t.tokenizer
    called = 0
    for r, log in enumerate(logs):
        calls = log.snapshot()
        prompt, seq, mask = _row(e, r)
        assert bool(e.valid[r]) and prompt == calls[0].prompt_ids  # one sequence, whole
        assert [i for i, k in zip(seq, mask) if k] == [i for c in calls for i in c.sampled_ids]  # the trained ids are the sampled ones
        p_ids, p_mask, _ = tools.engine.generate_episodes([tools._render(calls[0].messages)], ONE_TOKEN, [0], _NoCalls())
        assert p_ids[0][p_mask[0].bool()].tolist() == prompt  # the `tools:` path's prompt ids for this row
        if not calls[0].tool_calls:
            continue
        called += 1
        first, second = calls[0], calls[1]
        (tc,) = first.reply["tool_calls"]
        expr = json.loads(tc["function"]["arguments"])["expression"]
        assert tc["function"]["name"] == "calculator" and tok.decode(first.sampled_ids).endswith(f"<calc>{expr}</calc>")
        between = second.prompt_ids[len(prompt) + len(first.sampled_ids) :]
        driver = _Driver(tools, [tools._start({"prompt": first.messages})])  # what `tools:` appends after this very turn
        assert driver.end_turn(0, first.sampled_ids, eos=False)
        assert driver.ready(block=True)[0] == between and tok.decode(between).startswith("<result>")
        n1, n2 = len(first.sampled_ids), len(between)
        assert seq[: n1 + n2] == first.sampled_ids + between and mask[: n1 + n2 + 1] == [1] * n1 + [0] * n2 + [1]
    assert called > 0


class _NoCalls:
    """A TurnDriver for reading the `tools:` prompt ids: every turn ends the episode."""

    stop_strings: list[str] = []

    def end_turn(self, row, turn_ids, eos):
        return False

    def ready(self, block):
        return {}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["tools.format=tags"], "`rollout.agent` with tools.format=tags needs tools.tags: the tag of each tool the agent offers"),
        (["tools.functions=[calculator]"], "`rollout.agent` runs the episodes itself: it cannot be combined with `tools`"),
    ],
)
def test_an_agent_with_tags_needs_them_and_runs_its_own_tools(overrides, message):
    from rlvr.config import ConfigError
    from rlvr.training.setup import check_config

    cfg = load_config(None, [f"rollout.agent={EXAMPLE}", "rewards=[]", *overrides])
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        check_config(cfg)


def test_rlvr_eval_of_a_tools_run_with_an_agent_keeps_its_tags_and_drops_its_tools(tmp_path):
    """The model trained through `tools:` is scored with the agent: its calculator goes (the agent has its own), its tags stay."""
    import argparse

    from rlvr.training.eval_command import Target, eval_config

    (tmp_path / "config.yaml").write_text((REPO / "examples" / "tools-calculator.yaml").read_text())
    args = argparse.Namespace(task=None, system_prompt=None, agent=EXAMPLE, agent_timeout=None, overrides=[])
    cfg = eval_config(Target(str(tmp_path / "final"), tmp_path / "config.yaml", tmp_path), args)
    t = cfg.tools
    assert cfg.rollout.agent == EXAMPLE and t.functions == [] and (t.format, t.tags, t.describe) == ("tags", ["calculator=calc"], False)
