"""Tools run while the multi-turn decode goes on: an episode waiting for a slow tool does not hold
back the others, an episode's tokens do not depend on when any tool finished, failures and
timeouts still come back as messages, and a decode with nothing to run waits without spinning.

The episodes are the bundled tiny-tools model playing guess_number through MultiTurnSource, the hf
engine and a real ToolRunner; what happens when is read from the order of events, not from clocks.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from _callers import hermes_tokenizer
from rlvr.tasks import guess_number as gn
from rlvr.tasks.guess_number import GuessNumber
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.rollout import SamplingParams
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.sources.multi_turn import MultiTurnSource, make_format
from rlvr.rollout.engines.turns import Trace
from rlvr.tools import EnvironmentFactory, HermesFormat, ToolRunner, ToolSet

RELEASE = threading.Event()  # set at the end of the module: frees the threads of tools that "hang"


@pytest.fixture(scope="module", autouse=True)
def _release_hung_tools():
    yield
    RELEASE.set()


TARGETS, G = [3, 11, 20, 27], 2  # guess_number targets (greedy, the first guess is 15), episodes per target


@pytest.fixture(scope="module")
def tiny_tools():
    tok, _ = load_tokenizer("tiny-tools")
    return load_model("tiny-tools").eval(), tok


@pytest.fixture(scope="module")
def greedy_instant(tiny_tools):
    """TARGETS' greedy episodes, at most 3 turns, tools answering at once."""
    return rollout(tiny_tools, game(), ToolRunner(timeout_s=30), TARGETS, G=G, temperature=0.0, max_turns=3)[0]


SAMPLED_TARGETS, SAMPLED_G = [5, 11, 18, 26], 4


@pytest.fixture(scope="module")
def sampled_instant(tiny_tools):
    """SAMPLED_TARGETS' episodes at temperature 1, tools answering at once."""
    return rollout(tiny_tools, game(), ToolRunner(timeout_s=30), SAMPLED_TARGETS, G=SAMPLED_G, temperature=1.0)[0]


def game(before_guess=None) -> type:
    """guess_number whose `guess` first calls before_guess(target, guesses made so far)."""

    class Game(GuessNumber):
        def reset(self, **row):
            self.target, self.made = int(row["target"]), 0
            return super().reset(**row)

        def guess(self, number: int) -> str:
            made, self.made = self.made, self.made + 1
            if before_guess is not None:
                before_guess(self.target, made)
            return super().guess(number)

    Game.guess.__doc__ = GuessNumber.guess.__doc__
    return Game


class Logged:
    """The hf engine, handing the decode a driver that logs, in order, each turn that called
    tools ("call"), each episode's end ("done") and each return to the decode ("resumed")."""

    def __init__(self, engine, on_event=None):
        self.engine, self.on_event, self.events = engine, on_event, []

    def sync_weights(self):
        self.engine.sync_weights()

    def log(self, kind: str, row: int) -> None:
        self.events.append((kind, row))
        if self.on_event is not None:
            self.on_event(self.events)

    def generate_episodes(self, prompts, params, seeds, driver):
        engine = self

        class Driver:
            stop_strings = driver.stop_strings

            @staticmethod
            def end_turn(row, turn_ids, eos):
                waits = driver.end_turn(row, turn_ids, eos)
                engine.log("call" if waits else "done", row)
                return waits

            @staticmethod
            def ready(block):
                out = driver.ready(block)
                for row in sorted(out):
                    engine.log("resumed", row)
                return out

        return self.engine.generate_episodes(prompts, params, seeds, Driver())


def rollout(tiny_tools, env_class, runner, targets, *, G, temperature, max_turns=6, on_event=None):
    model, tok = tiny_tools
    env = EnvironmentFactory(env_class)
    fmt = make_format(
        "tags", tok, tool_names=env.names, schemas=env.schemas, tags={}, result_tags=("<result>", "</result>"), describe=False
    )  # tiny-tools learnt the tags without a description
    engine = Logged(HFEngine(model, tok), on_event)
    # 270 new tokens fit the model's 320 positions after the 30-token prompt: no episode is cut short
    source = MultiTurnSource(
        engine,
        tok,
        SamplingParams(n=G, temperature=temperature, max_new_tokens=270),
        fmt=fmt,
        environment=env,
        runner=runner,
        max_turns=max_turns,
    )
    with runner:
        episodes = source.rollout([gn.row(t) for t in targets], [100 + i for i in range(len(targets))])
    return episodes, engine.events


def assert_same_rows(a, b, rows):
    """Rows r of two batches of episodes hold the same episode (the batches may pad to different lengths)."""
    for r in rows:
        n = int(a.attention_mask[r].sum())
        assert int(b.attention_mask[r].sum()) == n and a.completions[r] == b.completions[r]
        assert a.completion_ids[r, :n].tolist() == b.completion_ids[r, :n].tolist()
        assert a.loss_mask[r, :n].tolist() == b.loss_mask[r, :n].tolist()
        # a row's batch-mates in each forward differ with the timing: fp32 rounding, not another sample
        torch.testing.assert_close(a.sampling_logprobs[r, :n], b.sampling_logprobs[r, :n], rtol=0, atol=1e-5)


def test_a_slow_tool_does_not_hold_back_the_other_episodes(tiny_tools, greedy_instant):
    """The first guess of the episodes of target 11 is held until every other episode has ended:
    with a decode that waited for it, the others could not end and the hold would time out."""
    targets, slow = TARGETS, 11
    slow_rows = {targets.index(slow) * G + j for j in range(G)}
    others_done, released = threading.Event(), []

    def hold_first_guess(target, made):
        if target == slow and made == 0:
            released.append(others_done.wait(timeout=30))

    def on_event(events):
        done = {row for kind, row in events if kind == "done"}
        if done >= set(range(len(targets) * G)) - slow_rows:
            others_done.set()

    held, events = rollout(
        tiny_tools, game(hold_first_guess), ToolRunner(timeout_s=60), targets, G=G, temperature=0.0, max_turns=3, on_event=on_event
    )
    assert released == [True] * G  # each held call was let go by the other episodes ending, not by its timeout
    assert not held.truncated.any()
    first_slow_return = min(i for i, (kind, row) in enumerate(events) if kind == "resumed" and row in slow_rows)
    for row in set(range(len(targets) * G)) - slow_rows:
        assert events.index(("done", row)) < first_slow_return
        assert ("call", row) in events  # the others called tools too, and got their results meanwhile
    assert all(m["content"] in ("higher", "lower", "correct") for r in slow_rows for m in held.completions[r] if m["role"] == "tool")
    assert_same_rows(held, greedy_instant, range(len(targets) * G))


@pytest.mark.parametrize("workers", [None, 2])  # 2 threads: calls also queue, finishing in yet another order
def test_episodes_do_not_depend_on_when_tools_finish(tiny_tools, sampled_instant, workers):
    delays = random.Random(workers)

    def random_delay(target, made):
        time.sleep(delays.random() * 0.03)

    instant, n = sampled_instant, len(SAMPLED_TARGETS) * SAMPLED_G
    delayed, _ = rollout(
        tiny_tools, game(random_delay), ToolRunner(timeout_s=30, max_workers=workers), SAMPLED_TARGETS, G=SAMPLED_G, temperature=1.0
    )
    assert float(instant.info["tool_calls"].sum()) >= 2 * n  # several rounds of calls per episode
    assert len(set(map(tuple, instant.completion_ids.tolist()))) > len(SAMPLED_TARGETS)  # sampled: a group's episodes differ
    assert_same_rows(delayed, instant, range(n))
    assert torch.equal(delayed.info["tool_calls"], instant.info["tool_calls"]) and torch.equal(delayed.truncated, instant.truncated)


def test_a_failing_or_hanging_tool_is_a_message_and_the_other_episodes_go_on(tiny_tools, greedy_instant):
    targets, raises, hangs = TARGETS, 3, 20

    def misbehave(target, made):
        if target == raises:
            raise RuntimeError("boom")
        if target == hangs:
            RELEASE.wait(timeout=60)

    failed, _ = rollout(tiny_tools, game(misbehave), ToolRunner(timeout_s=0.5), targets, G=G, temperature=0.0, max_turns=3)
    rows = {t: [targets.index(t) * G + j for j in range(G)] for t in targets}
    for target, message in ((raises, "error: guess raised RuntimeError: boom"), (hangs, "error: guess timed out after 0.5s")):
        for r in rows[target]:
            replies = [m["content"] for m in failed.completions[r] if m["role"] == "tool"]
            assert replies and all(x == message for x in replies)
            assert failed.info["tool_failures"][r] == failed.info["tool_calls"][r] == len(replies)
    assert_same_rows(failed, greedy_instant, rows[11] + rows[27])
    assert float(failed.info["tool_failures"][rows[11] + rows[27]].sum()) == 0.0


class TwoCalls:
    """An engine whose one episode writes a single turn calling `slow` then `fast` (no bundled model
    writes two calls in one turn), then waits as the hf decode does when nothing else can run:
    ready(block=True) until its results come back. Keeps what each blocked ready() returned."""

    def __init__(self, tok):
        self.tok, self.blocked = tok, []

    def sync_weights(self):
        pass

    def generate_episodes(self, prompts, params, seeds, driver):
        turn = (
            '<tool_call>{"name": "slow", "arguments": {"x": "a"}}</tool_call>'
            '<tool_call>{"name": "fast", "arguments": {"x": "b"}}</tool_call><|im_end|>'
        )
        tr = Trace(ids=self.tok(turn, add_special_tokens=False)["input_ids"])
        tr.loss, tr.logps = [1] * len(tr.ids), [0.0] * len(tr.ids)
        assert driver.end_turn(0, list(tr.ids), True)
        while len(self.blocked) < 10_000:
            out = driver.ready(block=True)
            self.blocked.append(out)
            if out:
                break
        ext = out.get(0) or []
        tr.ids += ext
        tr.loss += [0] * len(ext)
        tr.logps += [0.0] * len(ext)
        enc = self.tok(list(prompts), return_tensors="pt", add_special_tokens=False)
        return enc["input_ids"], enc["attention_mask"], [tr]


def slow(x: str) -> str:
    """Answer after a while.

    Args:
        x: anything
    """
    time.sleep(0.2)
    return "slow done"


def fast(x: str) -> str:
    """Answer at once.

    Args:
        x: anything
    """
    return "fast done"


def test_a_blocked_decode_waits_for_a_whole_turn_of_calls_without_spinning():
    """Waiting, the decode asks once and gets the episode back once both calls are done; the faster
    call finishing first must not wake it with nothing to run (it used to spin until the slower one
    finished), and the results come back in the order of the calls."""
    tok = hermes_tokenizer()
    engine = TwoCalls(tok)
    source = MultiTurnSource(
        engine, tok, SamplingParams(n=1), fmt=HermesFormat(), tools=ToolSet([slow, fast]), runner=ToolRunner(timeout_s=30)
    )
    with source.runner:
        e = source.rollout([{"prompt": [{"role": "user", "content": "go"}]}], [0])
    assert len(engine.blocked) == 1 and list(engine.blocked[0]) == [0]
    conv = e.completions[0]
    assert [c["function"]["name"] for c in conv[0]["tool_calls"]] == ["slow", "fast"]
    assert conv[1:3] == [{"role": "tool", "name": "slow", "content": "slow done"}, {"role": "tool", "name": "fast", "content": "fast done"}]
