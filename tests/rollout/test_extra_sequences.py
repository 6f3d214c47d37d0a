"""Episodes.extra_sequences: an episode's training sequences beyond its first (an outside agent that rewrote its
history) follow their episode through select, concat and to(), and the update trains them with its advantage."""

from __future__ import annotations

import torch

from rlvr.rollout import Episodes
from rlvr.training.collect import Batch
from rlvr.training.minibatches import this_ranks_minibatches

PAD = 0


def _rows(completions: list[list[int]], prompt: list[int], group_size: int, tag: float) -> Episodes:
    """Rows with the given completion ids (all trained), one prompt; info "tag" numbers the rows from `tag`."""
    n, C = len(completions), max(len(c) for c in completions)
    ids = torch.full((n, C), PAD)
    attn = torch.zeros(n, C, dtype=torch.long)
    for i, c in enumerate(completions):
        ids[i, : len(c)], attn[i, : len(c)] = torch.tensor(c), 1
    return Episodes(
        torch.tensor([prompt] * n), torch.ones(n, len(prompt), dtype=torch.long), ids, attn, attn.clone(), -attn.float(),
        torch.zeros(n, dtype=torch.bool), torch.arange(n) // group_size, group_size, [str(c) for c in completions],
        [str(c) for c in completions], info={"tag": tag + torch.arange(n, dtype=torch.float32)},
    )  # fmt: skip


def _batch() -> Episodes:
    """2 groups x 2 episodes; episode 1 has one extra sequence, episode 2 two."""
    e = _rows([[11], [12, 12], [13], [14, 14, 14]], [5, 6], 2, tag=0.0)
    e.extra_sequences = _rows([[21, 21], [31], [32, 32, 32, 32]], [7, 8, 9], 2, tag=100.0)
    e.extra_sequence_of = torch.tensor([1, 2, 2])
    return e


def _first_tokens(e: Episodes | None) -> list[int]:
    return [] if e is None else e.completion_ids[:, 0].tolist()


def test_select_keeps_each_episodes_extra_sequences_with_its_new_row():
    e = _batch()
    s = e.select(torch.tensor([2, 3, 0, 1]))
    assert _first_tokens(s.extra_sequences) == [21, 31, 32] and s.extra_sequence_of.tolist() == [3, 0, 0]
    s = e.select(torch.tensor([0, 1]))
    assert _first_tokens(s.extra_sequences) == [21] and s.extra_sequence_of.tolist() == [1]
    s = e.select(torch.tensor([3, 0]))
    assert s.extra_sequences is None and s.extra_sequence_of is None


def test_concat_moves_the_second_parts_extra_sequences_by_its_rows():
    a, b = _batch(), _batch().select(torch.tensor([0, 1]))
    c = Episodes.concat([b, a], PAD)
    assert _first_tokens(c.extra_sequences) == [21, 21, 31, 32] and c.extra_sequence_of.tolist() == [1, 3, 4, 4]
    assert _first_tokens(c.to("cpu").extra_sequences) == [21, 21, 31, 32]


def test_the_update_trains_extra_sequences_with_their_episodes_advantage():
    e = _batch()
    adv = torch.tensor([0.5, -0.5, 1.0, -1.0])
    full, full_adv = e.with_extra_sequences(adv)
    assert len(full) == 7 and full.extra_sequences is None
    assert _first_tokens(full) == [11, 12, 13, 14, 21, 31, 32]
    assert full_adv.tolist() == [0.5, -0.5, 1.0, -1.0, -0.5, 1.0, 1.0]
    assert full.info["tag"].tolist() == [0, 1, 2, 3, 1, 2, 2]  # per-episode fields: the episode's own
    assert full.prompt_ids[4:][full.prompt_mask[4:].bool()].view(3, -1).tolist() == [[7, 8, 9]] * 3  # the sequence's own prompt
    assert full.loss_mask[6].tolist() == [1, 1, 1, 1] and full.sampling_logprobs[6].tolist() == [-1.0] * 4
    assert not set(full.group_ids[4:].tolist()) & set(full.group_ids[:4].tolist())  # no group (shared prompt) with the rows

    class OneProcess:
        enabled = False

    batch = Batch([{"prompt": "a"}, {"prompt": "b"}], e, torch.zeros(4, 1), ["r"], torch.ones(1))
    second = this_ranks_minibatches(batch, adv, 2, OneProcess())[1]  # the second group's minibatch: episodes 2 and 3
    assert _first_tokens(second.episodes) == [13, 14, 31, 32] and second.advantages.tolist() == [1.0, -1.0, 1.0, 1.0]
