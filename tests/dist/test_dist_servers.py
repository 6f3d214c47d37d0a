"""Several trainer ranks with tools: `nproc=2` with tools, and with an environment, gives the losses and
gradients of one process (DDP and FSDP2), through a generation server and in process, at the tolerance
of test_dist.py, and its weights at 1e-4 (see the test); the episodes really call the tools (through a
server: by its turn requests)."""

from __future__ import annotations

import json

import pytest
import torch

from _callers import train_caller
from _runs import DENSE_REWARD
from _servers import start_servers
from rlvr.models.tokenizer import build_char_tokenizer
from test_dist import _launch, _max_diff, _wait

TOOLS = '''
def multiply(expression: str) -> str:
    """Multiply two integers written as a*b.

    Args:
        expression: The product to compute, e.g. 12*34.

    Returns:
        The product.
    """
    a, b = expression.split("*")
    return str(int(a) * int(b))


class CalcEnv:
    def reset(self, **kwargs) -> str | None:
        self.calls = 0
        return None

    def get_reward(self) -> float:
        return float(self.calls == 1)

    def multiply(self, expression: str) -> str:
        """Multiply two integers written as a*b.

        Args:
            expression: The product to compute, e.g. 12*34.

        Returns:
            The product.
        """
        self.calls += 1
        a, b = expression.split("*")
        return str(int(a) * int(b))
'''


@pytest.fixture(scope="module")
def caller(tmp_path_factory):
    """A char model that writes `<calc>12*34</calc>`, reads the result, then answers in one of three ways: rewards
    that vary within a group (a real update) by what it was taught, not by how far 80 steps of training got on
    this CPU (one answer alone is learnt to certainty on some CPUs: every advantage 0)."""
    tok = build_char_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "12*34="}], add_generation_prompt=True, tokenize=False)
    call = [(prompt, False), ("<calc>12*34</calc>", True), ("<result>408</result>", False)]
    episodes = [[*call, (answer + tok.eos_token, True)] for answer in ("408", "it is 408", "408, so")]
    model, _ = train_caller(tok, episodes, steps=80)
    path = tmp_path_factory.mktemp("caller")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    (path / "tools.py").write_text(TOOLS)
    (path / "reward.py").write_text(DENSE_REWARD)
    (path / "data.jsonl").write_text("".join(json.dumps({"prompt": [{"role": "user", "content": "12*34="}]}) + "\n" for _ in range(8)))
    return path


@pytest.fixture(scope="module")
def two_servers(caller):
    servers = start_servers(str(caller), 2)  # one for each run: a server follows one trainer's weights
    yield servers
    for s in servers:
        s.kill()


@pytest.mark.parametrize(
    "kind,strategy,where",
    [
        *[(kind, strategy, "server") for kind in ("tools", "environment") for strategy in ("ddp", "fsdp")],
        ("environment", "fsdp", "in_process"),  # tools with nproc > 1 are not refused in process either
    ],
)
def test_two_ranks_with_tools_equal_one(tmp_path, caller, two_servers, kind, strategy, where):
    agent = (
        [f"tools.functions=[{caller / 'tools.py'}:multiply]"] if kind == "tools" else [f"tools.environment={caller / 'tools.py'}:CalcEnv"]
    )
    common = [
        f"model.path={caller}",
        "data.task=null",
        f"data.path={caller / 'data.jsonl'}",
        f"rewards.0.fn={caller / 'reward.py'}:digit_share",
        *agent,
        "tools.tags=[multiply=calc]",
        "tools.format=tags",
        "tools.describe=false",
        "rollout.group_size=4",
        "rollout.prompts_per_step=4",
        "rollout.max_new_tokens=40",
        "optim.micro_batch_size=4",
        "optim.pack_by_length=false",  # the same rows in each micro-batch on one rank as on two: the same padding
        "optim.skip_zero_advantage=false",
        "algo.sampler_correction=none",  # its weights are exp(gap) ~ 1, recomputed per rank: more rounding to compare
        "algo.clip_cov_ratio=0",  # Clip-Cov (the default) draws its tokens among each rank's rows: not one draw
        "optim.lr=0.001",
        "threads=1",
        "model.autocast=none",
        "report_to=[]",
        "doctor_every=0",
        f"dist.strategy={strategy}",
    ]
    servers = [[f"rollout.servers=[{s.url}]"] if where == "server" else [] for s in two_servers]
    one = _launch(1, tmp_path / "one.pt", 2, [*common, *servers[0]])
    two = _launch(2, tmp_path / "two.pt", 2, [*common, *servers[1]])
    for rc, out in _wait(one + two, timeout=300):
        assert rc == 0, out[-3000:]
    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert b["strategy"] == strategy
    for step in range(2):
        assert a["metrics"][step]["tools/call_frequency"] > 0 and a["metrics"][step]["grad_norm"] > 0  # tools ran; a real update
        assert abs(a["loss"][step] - b["loss"][step]) < 1e-5, (a["loss"], b["loss"])
        assert _max_diff(a["grads"][step], b["grads"][step]) < 1e-5
        for key in ("reward", "tools/call_frequency", "completions/mean_length"):
            assert abs(a["metrics"][step][key] - b["metrics"][step][key]) < 1e-5, key
    # Weights: 1e-4, not test_dist's 1e-5. The gradients agree at 1e-5 (measured ~3e-7: the two ranks sum their
    # micro-batches in another order), but Adam divides each entry by its own magnitude, so an entry whose gradient
    # is as small as that rounding moves by up to lr either way: episodes of 40 tokens give such entries where
    # test_dist's 6-token ones do not (measured 3e-5 after two steps at lr 1e-3).
    assert _max_diff(a["weights"], b["weights"]) < 1e-4


def test_two_ranks_with_rollouts_made_ahead(tmp_path, caller, two_servers):
    """nproc=2 with max_staleness=1: each rank makes its share of the next batch while the step trains; no row
    is more than one version old (which rows are is a matter of timing, so no comparison with one process)."""
    overrides = [
        f"model.path={caller}",
        "data.task=null",
        f"data.path={caller / 'data.jsonl'}",
        f"rewards.0.fn={caller / 'reward.py'}:digit_share",
        f"tools.functions=[{caller / 'tools.py'}:multiply]",
        "tools.tags=[multiply=calc]",
        "tools.format=tags",
        "tools.describe=false",
        "rollout.group_size=4",
        "rollout.prompts_per_step=4",
        "rollout.max_new_tokens=40",
        "threads=1",
        "report_to=[]",
        "doctor_every=0",
        f"rollout.servers=[{two_servers[0].url},{two_servers[1].url}]",
        "rollout.max_staleness=1",
    ]
    for rc, out in _wait(_launch(2, tmp_path / "two.pt", 4, overrides), timeout=300):
        assert rc == 0, out[-3000:]
    m = torch.load(tmp_path / "two.pt")["metrics"]
    assert [x["step"] for x in m] == [1, 2, 3, 4]
    assert all(x["staleness/max"] <= 1 for x in m) and max(x["staleness/max"] for x in m) == 1
    assert all(x["tools/call_frequency"] > 0 for x in m)
