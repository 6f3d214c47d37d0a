"""The calls of one outside-agent episode, and the training sequences they make.

Every request an agent makes to the endpoint is a Call: the prompt token ids the model saw, the
token ids it sampled with their log-probs, and what the call answered (chat messages, or a
completion prompt's text). `EpisodeLog.sequences()` turns the calls into what is trained:

    call 1: prompt P1, sampled S1          sequence: P1 S1 G2 S2 G3 S3 ...
    call 2: prompt P2 = P1 S1 G2, sampled S2    mask:     0  1  0  1  0  1
    ...

A call whose prompt starts with an open sequence's ids (its last call's prompt + sampled ids)
extends that sequence: its sampled tokens are trained (mask 1, the sampler's log-probs), the ids
in between (tool results, user turns, template glue) are context (mask 0). A call that extends no
sequence (the agent rewrote or trimmed its history, or sent a message the endpoint did not write)
starts a new one: a split, counted, never merged by guesswork.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Call:
    """One sampled reply (a request with n choices records n calls with the same prompt)."""

    index: int  # the request's order in its episode (its seed is derived from it)
    prompt_ids: list[int]
    sampled_ids: list[int]
    logprobs: list[float]  # [len(sampled_ids)] the sampler's log-prob of each sampled id
    finish: str  # "stop" (EOS or a stop string), "length" (max_tokens reached)
    messages: list[dict] | None = None  # the chat messages it answered (None: a completion)
    reply: dict | None = None  # the assistant message returned for it ({"role", "content", "tool_calls"?})
    prompt_text: str | None = None  # a completion's prompt text (None: token ids were sent, or a chat call)
    text: str = ""  # the sampled text as returned (stop string cut)
    full_text: str = ""  # the sampled ids decoded with special tokens: what an agent appends to continue
    tool_calls: int = 0  # tool calls parsed from the reply


@dataclass
class TrainingSequence:
    """One sequence to train on: ids with a loss mask on the sampled tokens and their log-probs."""

    ids: list[int]
    mask: list[int]  # [len(ids)] 1 on sampled tokens, 0 on prompt and external tokens
    logprobs: list[float]  # [len(ids)] the sampler's log-prob on sampled tokens, 0 elsewhere
    prompt_length: int  # tokens before the first sampled one
    calls: list[int] = field(default_factory=list)  # Call.index of each call it holds, in order

    def extend(self, call: Call) -> None:
        gap = len(call.prompt_ids) - len(self.ids)
        self.ids = list(call.prompt_ids) + list(call.sampled_ids)
        self.mask += [0] * gap + [1] * len(call.sampled_ids)
        self.logprobs += [0.0] * gap + list(call.logprobs)
        self.calls.append(call.index)


def _canonical(tc: dict) -> tuple[str, str]:
    fn = tc.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return fn.get("name") or "", args
    return fn.get("name") or "", json.dumps(args, sort_keys=True)


def _same_calls(a: list[dict], b: list[dict]) -> bool:
    """The same tool calls (names and arguments, whatever their JSON spacing or key order), in order."""
    return [_canonical(x) for x in a] == [_canonical(x) for x in b]


def continues(call: Call, seq: TrainingSequence) -> bool:
    """The call's prompt starts with everything the sequence holds."""
    n = len(seq.ids)
    return len(call.prompt_ids) >= n and call.prompt_ids[:n] == seq.ids


class EpisodeLog:
    """The calls of one episode, in the order their requests arrived. Thread-safe: an agent may
    make calls concurrently (n > 1, parallel branches)."""

    def __init__(self, episode: str, seed: int):
        self.episode, self.seed = episode, seed
        self.calls: list[Call] = []
        self._requests = 0
        self._lock = threading.Lock()

    def next_request(self) -> int:
        """The index of a new request (its seed's position in the episode)."""
        with self._lock:
            k = self._requests
            self._requests += 1
            return k

    def record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)
            self.calls.sort(key=lambda c: c.index)  # stable: the n choices of a request keep their order

    @property
    def requests(self) -> int:
        return self._requests

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def sequences(self) -> list[TrainingSequence]:
        """The training sequences, each call joined to the longest open sequence it continues."""
        seqs: list[TrainingSequence] = []
        for call in self.snapshot():
            fits = [s for s in seqs if continues(call, s)]
            if fits:
                max(fits, key=lambda s: len(s.ids)).extend(call)
                continue
            seq = TrainingSequence([], [], [], len(call.prompt_ids))
            seq.extend(call)
            seqs.append(seq)
        return seqs

    def summary(self) -> dict[str, int]:
        """Per-episode counts for metrics: calls, sampled tokens, tool calls parsed, sequences, splits."""
        calls, seqs = self.snapshot(), self.sequences()
        return {
            "calls": len(calls),
            "sampled_tokens": sum(len(c.sampled_ids) for c in calls),
            "tool_calls": sum(c.tool_calls for c in calls),
            "sequences": len(seqs),
            "splits": max(0, len(seqs) - 1),
        }

    def splits(self) -> int:
        """Sequences beyond the first: how often a call did not continue the episode."""
        return max(0, len(self.sequences()) - 1)

    def find_reply(self, message: dict[str, Any], position: int | None = None) -> Call | None:
        """The call whose reply this assistant message is: by its tool calls' ids when it has any (else
        the same calls: names and arguments), otherwise by its exact content among replies without tool
        calls (the latest such, preferring one that answered a conversation of `position` messages: the
        one this message follows)."""
        sent = [tc for tc in message.get("tool_calls") or [] if isinstance(tc, dict)]
        calls = self.snapshot()
        if sent:
            replies = [c for c in calls if c.reply is not None and c.reply.get("tool_calls")]
            by_id = [c for c in replies if [tc["id"] for tc in c.reply["tool_calls"]] == [tc.get("id") for tc in sent]]  # type: ignore[index]
            by_call = [c for c in replies if _same_calls(c.reply["tool_calls"], sent)]  # type: ignore[index]
            pick = by_id or by_call  # a framework that renumbers the ids: the same calls, in the same order
            return pick[-1] if pick else None
        content = message.get("content") or ""
        same = [c for c in calls if c.reply is not None and not c.reply.get("tool_calls") and (c.reply.get("content") or "") == content]
        here = [c for c in same if c.messages is not None and len(c.messages) == position]
        pick = here or same
        return pick[-1] if pick else None

    def find_completion(self, prompt_text: str) -> Call | None:
        """The completion whose prompt text + sampled text (decoded with special tokens) is the
        longest start of `prompt_text`: the agent continued it."""
        best, longest = None, -1
        for call in self.snapshot():
            done = None if call.prompt_text is None else call.prompt_text + call.full_text
            if done is not None and prompt_text.startswith(done) and len(done) > longest:
                best, longest = call, len(done)
        return best
