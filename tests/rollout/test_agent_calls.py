"""An outside agent's calls -> training sequences (rlvr.rollout.sources.agent.calls), with exact ids:
continuing calls make one sequence with the sampled tokens masked in and everything between masked
out; a call that continues nothing starts a new sequence and counts as a split."""

from __future__ import annotations

from rlvr.rollout.sources.agent.calls import Call, EpisodeLog


def _call(k, prompt, sampled, **kw):
    return Call(k, prompt, sampled, [-0.1 * (i + 1) - k for i in range(len(sampled))], "stop", **kw)


def test_continuing_calls_are_one_sequence_with_exact_masks():
    log = EpisodeLog("e", seed=3)
    log.record(_call(0, [1, 2, 3], [10, 11]))
    log.record(_call(1, [1, 2, 3, 10, 11, 50, 51], [12]))  # tool result 50 51 in between
    log.record(_call(2, [1, 2, 3, 10, 11, 50, 51, 12, 60], [13, 14, 2]))
    (seq,) = log.sequences()
    assert seq.ids == [1, 2, 3, 10, 11, 50, 51, 12, 60, 13, 14, 2]
    assert seq.mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]
    assert seq.logprobs == [0, 0, 0, -0.1, -0.2, 0, 0, -1.1, 0, -2.1, -2.2, -2.3]
    assert seq.prompt_length == 3 and seq.calls == [0, 1, 2]
    assert log.splits() == 0
    assert log.summary() == {"calls": 3, "sampled_tokens": 6, "tool_calls": 0, "sequences": 1, "splits": 0}


def test_a_call_that_does_not_continue_starts_a_new_sequence_and_counts():
    log = EpisodeLog("e", seed=0)
    log.record(_call(0, [1, 2], [10, 11]))
    log.record(_call(1, [1, 2, 10, 99, 50], [12]))  # the reply was rewritten (11 -> 99): no continuation
    log.record(_call(2, [1, 2, 10, 99, 50, 12, 60], [13]))  # continues call 1
    a, b = log.sequences()
    assert (a.ids, a.mask, a.calls) == ([1, 2, 10, 11], [0, 0, 1, 1], [0])
    assert (b.ids, b.mask, b.calls, b.prompt_length) == ([1, 2, 10, 99, 50, 12, 60, 13], [0, 0, 0, 0, 0, 1, 0, 1], [1, 2], 5)
    assert log.splits() == 1


def test_a_call_joins_the_longest_sequence_it_continues_and_calls_keep_request_order():
    log = EpisodeLog("e", seed=0)
    log.record(_call(1, [1, 2, 10, 7], [20]))  # recorded first, asked second: sorted by request index
    log.record(_call(0, [1, 2], [10]))
    log.record(_call(0, [1, 2], [11]))  # the second choice of request 0 (n=2): a sequence of its own
    log.record(_call(2, [1, 2, 11, 8], [21]))  # continues the second choice only
    seqs = log.sequences()
    assert [(s.ids, s.calls) for s in seqs] == [([1, 2, 10, 7, 20], [0, 1]), ([1, 2, 11, 8, 21], [0, 2])]
    assert log.splits() == 1


def test_replies_are_found_by_tool_call_ids_then_by_content():
    log = EpisodeLog("e", seed=0)
    calls = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_e_0_0_0", "function": {"name": "f", "arguments": "{}"}}]}
    log.record(_call(0, [1], [5], messages=[{"role": "user"}], reply=calls))
    log.record(_call(1, [1, 5, 6], [7], messages=[{"role": "user"}] * 3, reply={"role": "assistant", "content": "42"}))
    log.record(_call(2, [1, 5, 6, 7, 8], [7], messages=[{"role": "user"}] * 5, reply={"role": "assistant", "content": "42"}))
    sent = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_e_0_0_0", "function": {"name": "f", "arguments": "{ }"}}]}
    assert log.find_reply(sent).index == 0  # the arguments re-serialized: the id still says which reply it is
    assert log.find_reply({**sent, "tool_calls": [{"id": "call_other"}]}) is None
    renumbered = {**sent, "tool_calls": [{"id": "call_1", "function": {"name": "f", "arguments": {}}}]}
    assert log.find_reply(renumbered).index == 0  # ids renumbered by a framework: the same call, arguments as a dict
    assert log.find_reply({**sent, "tool_calls": [{"id": "call_1", "function": {"name": "f", "arguments": '{"a": 1}'}}]}) is None
    assert log.find_reply({"role": "assistant", "content": "42"}, 3).index == 1  # the reply to a conversation of 3 messages
    assert log.find_reply({"role": "assistant", "content": "42"}, 9).index == 2  # else the latest
    assert log.find_reply({"role": "assistant", "content": "41"}) is None


def test_completions_continue_the_longest_earlier_completion():
    log = EpisodeLog("e", seed=0)
    log.record(Call(0, [1, 2], [3, 4], [-1.0, -1.0], "stop", prompt_text="ab", full_text="cd"))
    log.record(Call(1, [1, 2, 3, 4, 5], [6], [-1.0], "stop", prompt_text="abcde", full_text="f"))
    assert log.find_completion("abcdefg").index == 1
    assert log.find_completion("abcdX").index == 0
    assert log.find_completion("aX") is None
