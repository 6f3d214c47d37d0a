"""Episodes: what every kind of rollout hands the trainer, and the Protocol that makes them.

An episode is a prompt followed by segments: the model's turns (sampled tokens, trained: loss
mask 1, with the sampler's log-probs) and external text (tool results, environment replies,
chat-template glue between turns: in context, loss mask 0). A single-turn completion is the
episode with one model segment. The trainer never looks past this seam: a new kind of rollout
(multi-turn with tools, a user-supplied rollout function) is one class implementing
RolloutSource, and nothing in rlvr.training changes for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch


@dataclass
class Episodes:
    """A batch of N episodes, group-major: the group_size episodes of a prompt are consecutive
    when the batch is made (select() may reorder; group_ids keep track)."""

    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P] 1 on prompt tokens
    completion_ids: torch.Tensor  # [N, C] every token after the prompt, right-padded with pad_token_id
    attention_mask: torch.Tensor  # [N, C] 1 on every real token after the prompt (ones, then padding)
    loss_mask: torch.Tensor  # [N, C] 1 on the tokens the model sampled (trained), 0 on external text and padding
    sampling_logprobs: torch.Tensor  # [N, C] the sampler's log p of each model token, 0 elsewhere
    truncated: torch.Tensor  # [N] bool: ran out of token budget before finishing
    group_ids: torch.Tensor  # [N] long: the group (prompt) of each row, unique within the batch
    group_size: int  # G: episodes per prompt
    completions: list[str | list[dict[str, Any]]]  # [N] what reward functions see (TRL's shape): text, or a list of messages
    texts: list[str]  # [N] the decoded text after the prompt, special tokens removed (logs)
    info: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [N] per-episode numbers the source reports (e.g. tool calls)
    extra_rewards: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [N] rewards the rollout itself gave (NaN: none)
    valid: torch.Tensor | None = None  # [N] bool; False: the episode failed to start and is left out (no reward, no loss)
    columns: dict[str, list[Any]] = field(default_factory=dict)  # name -> [N] values reward functions get as keyword arguments
    # [N, C] the sampler's entropy of each model token's distribution (at the sampling temperature, before
    # top-k/top-p), 0 elsewhere; None when the source does not give it (the trainer then runs a forward)
    sampling_entropy: torch.Tensor | None = None
    logged: dict[str, list[Any]] = field(default_factory=dict)  # column -> [N] values reward functions logged (TRL's log_extra)
    # [N] long: the weight version (trainer steps) each episode was sampled under; None: the trainer's current weights
    versions: torch.Tensor | None = None
    # Training sequences beyond an episode's first (an outside agent rewrote its history, so its calls make several):
    # M rows trained with their episode's advantage, never scored; extra_sequence_of [M] long: the row each belongs to.
    extra_sequences: Episodes | None = None
    extra_sequence_of: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def lengths(self) -> torch.Tensor:  # [N] tokens after the prompt (model and external)
        return self.attention_mask.sum(-1)

    @property
    def num_groups(self) -> int:
        return len(self) // self.group_size

    def select(self, rows: torch.Tensor) -> "Episodes":
        """The episodes at these row indices, in this order (group ids kept)."""
        idx = rows.tolist()
        return Episodes(
            self.prompt_ids[rows],
            self.prompt_mask[rows],
            self.completion_ids[rows],
            self.attention_mask[rows],
            self.loss_mask[rows],
            self.sampling_logprobs[rows],
            self.truncated[rows],
            self.group_ids[rows],
            self.group_size,
            [self.completions[i] for i in idx],
            [self.texts[i] for i in idx],
            {k: v[rows] for k, v in self.info.items()},
            {k: v[rows] for k, v in self.extra_rewards.items()},
            None if self.valid is None else self.valid[rows],
            {k: [v[i] for i in idx] for k, v in self.columns.items()},
            None if self.sampling_entropy is None else self.sampling_entropy[rows],
            {k: [v[i] for i in idx] for k, v in self.logged.items()},
            None if self.versions is None else self.versions[rows.to(self.versions.device)],
            *self._extras_of(idx),
        )

    def _extras_of(self, rows: list[int]) -> tuple[Episodes | None, torch.Tensor | None]:
        """The extra sequences of the episodes at `rows`, and their new row numbers (select's)."""
        if self.extra_sequences is None or self.extra_sequence_of is None:
            return None, None
        where: dict[int, int] = {}
        for i, r in enumerate(rows):
            where.setdefault(r, i)
        keep = [j for j, r in enumerate(self.extra_sequence_of.tolist()) if r in where]
        if not keep:
            return None, None
        of = torch.tensor([where[int(self.extra_sequence_of[j])] for j in keep])
        return self.extra_sequences.select(torch.tensor(keep)), of

    def with_extra_sequences(self, advantages: torch.Tensor) -> tuple[Episodes, torch.Tensor]:
        """What the update trains: these episodes, then their extra sequences (each with its episode's per-episode
        fields, its own group id, and its episode's advantage). `advantages`: [N]; returns [N + M]."""
        x, of = self.extra_sequences, self.extra_sequence_of
        if x is None or of is None:
            return self, advantages
        own = dataclasses.replace(self, extra_sequences=None, extra_sequence_of=None)
        tokens = ("prompt_ids", "prompt_mask", "completion_ids", "attention_mask", "loss_mask", "sampling_logprobs", "truncated")
        seqs = dataclasses.replace(
            own.select(of), **{k: getattr(x, k) for k in tokens}, completions=x.completions, texts=x.texts,
            sampling_entropy=x.sampling_entropy,  # concat keeps entropies only when both give them
        )  # fmt: skip
        return Episodes.concat([own, seqs], _pad_of(own)), torch.cat([advantages, advantages[of.to(advantages.device)]])

    def to(self, device: torch.device | str) -> "Episodes":
        t = {
            k: getattr(self, k).to(device)
            for k in (
                "prompt_ids",
                "prompt_mask",
                "completion_ids",
                "attention_mask",
                "loss_mask",
                "sampling_logprobs",
                "truncated",
                "group_ids",
            )
        }
        return Episodes(
            **t,
            extra_sequences=None if self.extra_sequences is None else self.extra_sequences.to(device),
            extra_sequence_of=self.extra_sequence_of,
            group_size=self.group_size,
            completions=self.completions,
            texts=self.texts,
            info=self.info,
            extra_rewards=self.extra_rewards,
            valid=self.valid,
            columns=self.columns,
            sampling_entropy=None if self.sampling_entropy is None else self.sampling_entropy.to(device),
            logged=self.logged,
            versions=self.versions,
        )

    @staticmethod
    def concat(parts: list["Episodes"], pad_token_id: int) -> "Episodes":
        """Stack batches of different widths (prompts re-padded on the left, the rest on the
        right); group ids are renumbered so that the groups of different parts stay apart."""
        if len(parts) == 1:
            return parts[0]
        if len({p.group_size for p in parts}) > 1:
            raise ValueError(f"cannot concatenate episodes of different group sizes {[p.group_size for p in parts]}")
        P = max(e.prompt_ids.shape[1] for e in parts)
        C = max(e.completion_ids.shape[1] for e in parts)

        def left(x: torch.Tensor, value: float) -> torch.Tensor:
            return torch.nn.functional.pad(x, (P - x.shape[1], 0), value=value)

        def right(x: torch.Tensor, value: float) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, C - x.shape[1]), value=value)

        offsets: list[int] = []
        total = 0
        for e in parts:
            offsets.append(total)
            total += int(e.group_ids.max()) + 1 if len(e) else 0
        entropies = [e.sampling_entropy for e in parts if e.sampling_entropy is not None]
        versions = [e.versions for e in parts if e.versions is not None]
        return Episodes(
            torch.cat([left(e.prompt_ids, pad_token_id) for e in parts]),
            torch.cat([left(e.prompt_mask, 0) for e in parts]),
            torch.cat([right(e.completion_ids, pad_token_id) for e in parts]),
            torch.cat([right(e.attention_mask, 0) for e in parts]),
            torch.cat([right(e.loss_mask, 0) for e in parts]),
            torch.cat([right(e.sampling_logprobs, 0.0) for e in parts]),
            torch.cat([e.truncated for e in parts]),
            torch.cat([e.group_ids + off for e, off in zip(parts, offsets)]),
            parts[0].group_size,
            [c for e in parts for c in e.completions],
            [t for e in parts for t in e.texts],
            _concat_dicts([e.info for e in parts]),
            _concat_dicts([e.extra_rewards for e in parts]),
            None if all(e.valid is None for e in parts) else torch.cat([_valid(e) for e in parts]),
            {k: [x for e in parts for x in e.columns[k]] for k in parts[0].columns},
            None if len(entropies) < len(parts) else torch.cat([right(x, 0.0) for x in entropies]),
            {k: [x for e in parts for x in e.logged.get(k, [None] * len(e))] for k in sorted({k for e in parts for k in e.logged})},
            None if len(versions) < len(parts) else torch.cat([v.cpu() for v in versions]),
            *_concat_extras(parts, pad_token_id),
        )


def _concat_dicts(dicts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    keys: set[str] = set().union(*dicts)
    if any(set(d) != keys for d in dicts):
        raise ValueError(f"cannot concatenate episodes that report different fields: {[sorted(d) for d in dicts]}")
    return {k: torch.cat([d[k] for d in dicts]) for k in sorted(keys)}


def _concat_extras(parts: list[Episodes], pad_token_id: int) -> tuple[Episodes | None, torch.Tensor | None]:
    extras, of, rows = [], [], 0
    for e in parts:
        if e.extra_sequences is not None and e.extra_sequence_of is not None:
            extras.append(e.extra_sequences)
            of.append(e.extra_sequence_of + rows)
        rows += len(e)
    return (Episodes.concat(extras, pad_token_id), torch.cat(of)) if extras else (None, None)


def _pad_of(e: Episodes) -> int:
    """The pad id the episodes are padded with (concat re-pads with it; any id would do under the masks)."""
    pad = torch.cat([e.completion_ids[e.attention_mask == 0], e.prompt_ids[e.prompt_mask == 0]])
    return int(pad[0]) if len(pad) else 0


def _valid(e: Episodes) -> torch.Tensor:
    return torch.ones(len(e), dtype=torch.bool) if e.valid is None else e.valid


class RolloutSource(Protocol):
    """Makes episodes for dataset rows: group_size episodes per row, group-major."""

    group_size: int

    def rollout(self, rows: list[dict[str, Any]], seeds: list[int]) -> Episodes:
        """Episodes of `rows` (row i's group is group i); row i's randomness comes from seeds[i] alone,
        so an episode does not depend on the batch, rank or resume it lands in."""
        ...

    def sync_weights(self) -> None:
        """Make the sampler use the trainer's current weights (a no-op when they are shared)."""
        ...

    def metrics(self, episodes: Episodes) -> dict[str, float]:
        """Metrics of one step's episodes that only this kind of rollout knows (e.g. tool calls); may be {}."""
        ...


def pad_rows(
    rows: Sequence[Sequence[float]], value: float, *, left: bool = False, min_width: int = 0, dtype: torch.dtype = torch.long
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lists of different lengths (token ids, log-probs, masks) as one tensor [N, W], W the longest
    (at least min_width), each row padded with `value` on the right (left=True: on the left, as
    prompts are), and the mask [N, W] (long) that is 1 on the lists' own entries."""
    W = max([min_width, *(len(r) for r in rows)])
    out = torch.full((len(rows), W), value, dtype=dtype)
    mask = torch.zeros(len(rows), W, dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            cols = slice(W - len(r), W) if left else slice(0, len(r))
            out[i, cols], mask[i, cols] = torch.as_tensor(r, dtype=dtype), 1
    return out, mask
