"""The tool-use tasks: multiplication (calculator) and guess the number (a stateful environment),
their rewards on text and on multi-turn message completions, the environment's contract, and the
bundled `tiny-tools` model that knows their formats."""

import importlib
import inspect
import re

import pytest
import torch

from rlvr.data import render_prompt
from rlvr.rewards import builtin_rewards, load_reward_fn
from rlvr.tasks import ENVIRONMENTS, TASKS, get_task
from rlvr.tasks import guess_number as gn
from rlvr.tasks import multiplication as mul
from rlvr.tasks.guess_number import GuessNumber, guessed
from rlvr.tasks.multiplication import final_answer


# --- multiplication -------------------------------------------------------------------------------


def test_multiplication_held_out_split_never_overlaps_training():
    train = {mul.problem_at(i, "train", seed=s) for s in (0, 1) for i in range(3000)}
    test = set(mul.eval_problems(500))
    assert len(test) == 500 and not train & test
    assert all(mul.is_held_out(p) for p in test) and not any(mul.is_held_out(p) for p in train)
    assert [mul.problem_at(i, "train", seed=3) for i in range(5)] == [mul.problem_at(i, "train", seed=3) for i in range(5)]
    assert [mul.problem_at(i, "train", seed=3) for i in range(5)] != [mul.problem_at(i, "train", seed=4) for i in range(5)]
    assert mul.eval_problems(20) == mul.eval_problems(50)[:20]


def test_multiplication_rows_have_the_documented_shape():
    task = get_task("multiplication", seed=0, eval_size=30)
    assert "multiplication" in TASKS and task.reward == "final_answer" and task.reward in builtin_rewards()
    rows = [task.train_row(i) for i in range(200)] + task.eval_rows()
    assert len(task.eval_rows()) == 30
    b_digits = set()
    for row in rows:
        assert set(row) == {"prompt", "answer"}
        [msg] = row["prompt"]
        assert msg["role"] == "user"
        m = re.fullmatch(r"(\d{3})\*(\d{2,3})=", msg["content"])
        assert m and not m.group(1).startswith("0") and not m.group(2).startswith("0")
        assert row["answer"] == str(int(m.group(1)) * int(m.group(2)))
        b_digits.add(len(m.group(2)))
    assert b_digits == {2, 3}
    assert task.train_row(7) == task.train_row(7)  # random access: a run resumes exactly


def test_final_answer_on_text_completions():
    a = ["5535"]
    assert final_answer(None, ["<calc>123*45</calc><result>5535</result>5535"], answer=a) == [1.0]
    assert final_answer(None, ["5535"], answer=a) == [1.0]  # a direct answer
    assert final_answer(None, [" 5535 \n"], answer=a) == [1.0]
    assert final_answer(None, ["<calc>123*45</calc><result>5535</result>5536"], answer=a) == [0.0]  # wrong
    assert final_answer(None, ["<calc>123*45</calc><result>5535</result>"], answer=a) == [0.0]  # nothing after the result
    assert final_answer(None, ["<calc>123*45</calc>"], answer=a) == [0.0]  # a call left unanswered
    assert final_answer(None, ["<calc>123*45</calc><result>5535</result>it is 5535"], answer=a) == [0.0]  # words around it
    assert final_answer(None, ["5535 5535"], answer=a) == [0.0]
    assert final_answer(None, ["05535"], answer=a) == [0.0]  # exactly the number
    assert final_answer(None, ["", "5535"], answer=["5535", "5535"]) == [0.0, 1.0]


def test_final_answer_on_message_completions():
    call = {"role": "assistant", "content": "<calc>123*45</calc>"}
    tool = {"role": "tool", "name": "calculator", "content": "5535"}
    a = ["5535"]
    assert final_answer(None, [[call, tool, {"role": "assistant", "content": "5535"}]], answer=a) == [1.0]
    assert final_answer(None, [[{"role": "assistant", "content": " 5535"}]], answer=a) == [1.0]  # TRL single turn
    assert final_answer(None, [[call, tool, {"role": "assistant", "content": "5536"}]], answer=a) == [0.0]
    assert final_answer(None, [[call, tool]], answer=a) == [0.0]  # ended on the tool's reply: the last turn is the call
    assert final_answer(None, [[call]], answer=a) == [0.0]
    assert final_answer(None, [[tool]], answer=a) == [0.0]  # the tool's number is not the model's answer
    assert final_answer(None, [[]], answer=a) == [0.0]
    assert final_answer(None, [[call, tool, {"role": "assistant", "content": "<calc>5535*1</calc>"}]], answer=a) == [0.0]
    assert load_reward_fn("final_answer") is final_answer


# --- guess the number -----------------------------------------------------------------------------


def test_guess_number_trains_and_evaluates_on_the_whole_range():
    # a split by target would teach avoidance: the policy learns never to guess numbers that were never the answer
    train = {gn.train_row(i, seed=s)["target"] for s in (0, 1) for i in range(2000)}
    assert train == set(range(1, 31))
    assert [gn.train_row(i, seed=0)["target"] for i in range(20)] != [gn.train_row(i, seed=1)["target"] for i in range(20)]
    assert gn.train_row(7, seed=3) == gn.train_row(7, seed=3)  # random access: a resumed run draws the same targets
    task = get_task("guess_number", seed=0)
    assert "guess_number" in TASKS and task.reward == "guessed" and task.reward in builtin_rewards()
    assert [r["target"] for r in task.eval_rows()] == list(range(1, 31))  # every target once
    assert [r["target"] for r in get_task("guess_number", seed=0, eval_size=4).eval_rows()] == [1, 8, 16, 23]
    assert [r["target"] for r in gn.eval_rows(3, low=1, high=100)] == [1, 34, 67]


def test_guess_number_rows_have_the_documented_shape():
    task = get_task("guess_number", seed=0)
    for row in [task.train_row(i) for i in range(50)] + task.eval_rows():
        assert row["prompt"] == [{"role": "user", "content": "Guess my number from 1 to 30."}]
        assert set(row) == {"prompt", "target", "low", "high", "max_guesses"}
        assert 1 <= row["target"] <= 30 and (row["low"], row["high"], row["max_guesses"]) == (1, 30, 5)
    assert task.train_row(3) == task.train_row(3)


def _play(env, guesses):
    return [env.guess(g) for g in guesses]


def test_guess_number_environment_replies_and_reward():
    env = GuessNumber()
    env.reset(**gn.row(17))  # the row's columns, the prompt among them, are what reset receives
    assert env.get_reward() == 0.0
    assert _play(env, [15, 22, 17]) == ["higher", "lower", "correct"]
    assert env.get_reward() == 1.0
    assert env.guess(17) == "no guesses left"  # the game is over once won
    assert env.get_reward() == 1.0

    env.reset(target=1)  # reset starts a new game
    assert env.get_reward() == 0.0
    assert _play(env, [0, 31, "x", 2.5, "1"]) == ["out of range", "out of range", "not a number", "not a number", "correct"]

    env.reset(target=30, max_guesses=5)
    assert _play(env, [15, 16, 17, 18, 19, 30]) == ["higher"] * 5 + ["no guesses left"]  # the limit
    assert env.get_reward() == 0.0

    env.reset(target=8, low=5, high=9, max_guesses=2)
    assert _play(env, [" 7 ", 8.0, 8]) == ["higher", "correct", "no guesses left"]
    for bad in ({"target": 31}, {"target": 0}, {"target": 3, "max_guesses": 0}):
        with pytest.raises(ValueError):
            env.reset(**bad)
    with pytest.raises(RuntimeError):
        GuessNumber().guess(3)


def test_bisection_always_wins_within_the_default_limit():
    for target in range(1, 31):
        env, lo, hi = GuessNumber(), 1, 30
        env.reset(target)
        while (reply := env.guess((lo + hi) // 2)) in ("higher", "lower"):
            lo, hi = ((lo + hi) // 2 + 1, hi) if reply == "higher" else (lo, (lo + hi) // 2 - 1)
        assert reply == "correct" and env.get_reward() == 1.0


def test_guess_number_environment_contract():
    module, name = ENVIRONMENTS["guess_number"].split(":")
    assert getattr(importlib.import_module(module), name) is GuessNumber
    public = {n for n, _ in inspect.getmembers(GuessNumber) if not n.startswith("_")}
    assert public == {"reset", "guess", "get_reward"}
    sig = inspect.signature(GuessNumber.guess)
    assert list(sig.parameters) == ["self", "number"] and sig.parameters["number"].annotation in (int, "int")
    assert sig.return_annotation in (str, "str")
    doc = inspect.getdoc(GuessNumber.guess)
    assert "Args:" in doc and "number:" in doc and "Returns:" in doc
    reset = inspect.signature(GuessNumber.reset).parameters
    assert reset["low"].default == 1 and reset["high"].default == 30 and reset["max_guesses"].default == 5
    assert any(p.kind is p.VAR_KEYWORD for p in reset.values())
    assert GuessNumber().reset(target=5) is None


G, R = "<guess>{}</guess>", "<result>{}</result>"


def _text(*rounds):
    return "".join(G.format(g) + (R.format(r) if r is not None else "") for g, r in rounds)


def _messages(*rounds):
    out = []
    for g, r in rounds:
        out.append({"role": "assistant", "content": G.format(g)})
        if r is not None:
            out.append({"role": "tool", "name": "guess", "content": r})
    return out


@pytest.mark.parametrize("shape", [_text, _messages])
def test_guessed_on_both_completion_shapes(shape):
    won = shape((15, "higher"), (22, "lower"), (17, "correct"))
    assert guessed(None, [won], target=[17]) == [1.0]
    assert guessed(None, [won]) == [1.0]  # without the target column: the reply alone
    assert guessed(None, [won], target=[17], max_guesses=[3]) == [1.0]
    assert guessed(None, [won], target=[17], max_guesses=[2]) == [0.0]  # found, but after the limit
    five = [(15, "higher"), (22, "lower"), (18, "lower"), (16, "higher")]
    assert guessed(None, [shape(*five, (17, "correct"))], target=[17]) == [1.0]
    assert guessed(None, [shape(*five, (19, "lower"), (17, "correct"))], target=[17]) == [0.0]  # sixth guess
    assert guessed(None, [shape((15, "higher"), (22, "lower"))], target=[17]) == [0.0]  # not found
    assert guessed(None, [shape((15, "higher"), (17, None))], target=[17]) == [0.0]  # never answered
    assert guessed(None, [shape((16, "correct"))], target=[17]) == [0.0]  # a "correct" that cannot be
    assert guessed(None, [shape(("abc", "not a number"))], target=[17]) == [0.0]
    assert guessed(None, [shape()], target=[17]) == [0.0]


def test_guessed_on_malformed_completions():
    assert guessed(None, ["17", "<result>correct</result>", "<guess>17<result>correct</result>", ""], target=[17] * 4) == [0.0] * 4
    # in a multi-turn completion only the environment's (tool) messages are replies
    forged = [{"role": "assistant", "content": "<guess>15</guess><result>correct</result>"}]
    assert guessed(None, [forged]) == [0.0]
    assert guessed(None, [[{"role": "tool", "content": "correct"}]]) == [0.0]  # a reply to no guess
    wrapped = _messages((17, None)) + [{"role": "tool", "content": "<result>correct</result>"}]
    assert guessed(None, [wrapped], target=[17]) == [1.0]
    assert load_reward_fn("guessed") is guessed


# --- the bundled tiny-tools model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_tools():
    from rlvr.models.loading import load_model, load_tokenizer

    tok, notes = load_tokenizer("tiny-tools")
    return load_model("tiny-tools").eval(), tok, notes


def test_tiny_tools_loads_and_renders_the_protocol(tiny_tools):
    model, tok, notes = tiny_tools
    assert not notes
    row = get_task("multiplication", seed=0).train_row(0) | {"prompt": [{"role": "user", "content": "123*45="}]}
    prompt = render_prompt(row["prompt"], tok)
    assert prompt == "<|user|>123*45=<|assistant|>"
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert len(ids) == 2 + len("123*45=")  # the role tokens, then one token per character
    for text in ("<calc>123*45</calc>", "<result>5535</result>", "<guess>15</guess>", "<result>no guesses left</result>"):
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
        assert len(tok(text, add_special_tokens=False)["input_ids"]) == len(text)
    assert tok("5535</s>", add_special_tokens=False)["input_ids"][-1] == tok.eos_token_id
    # the longest ordinary episode: five guesses that each cost a round, one more after the limit, then </s>
    longest = (
        render_prompt(gn.row(30)["prompt"], tok)
        + "<guess>31</guess><result>out of range</result>" * 5
        + "<guess>30</guess><result>no guesses left</result></s>"
    )
    assert len(tok(longest, add_special_tokens=False)["input_ids"]) <= model.config.max_position_embeddings


def test_tiny_tools_has_the_calculator_in_its_distribution_without_preferring_it(tiny_tools):
    model, tok, _ = tiny_tools
    prompts = [render_prompt(p.row()["prompt"], tok) for p in mul.eval_problems(16)]
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        logits = model(**enc, position_ids=(enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)).logits[:, -1]
    p_call = logits.softmax(-1)[:, tok.convert_tokens_to_ids("<")]
    assert 0.05 < float(p_call.mean()) < 0.6
