"""What the update reads and returns: the micro-batches, a minibatch's frozen inputs (prepared once, before its
first optimizer step), what the first epoch takes from its own forwards, and the result of a step's update."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from rlvr import algo
from rlvr.rollout.episodes import Episodes


class MicroBatch(NamedTuple):
    """One forward and backward."""

    position: int  # which of the minibatch's micro-batches (the one a lockstep repeat repeats); `index` is tuple's
    rows: slice  # into MinibatchInputs.episodes
    weight: float  # its weight in the loss: 0 for a repeat that only keeps this rank in lockstep with busier ones


class MinibatchInputs(NamedTuple):
    """What every epoch of one minibatch reads: N rows run, C completion tokens, on the training device."""

    episodes: Episodes  # N episodes, in micro-batch order (zero-advantage rows left out when the plan allows)
    advantages: torch.Tensor  # [N] float32
    loss_mask: torch.Tensor  # [N, C] float32: model tokens that count (truncated episodes masked when asked)
    micro_batches: tuple[MicroBatch, ...]  # this rank's, then its lockstep repeats
    norms: algo.BatchNorms  # the whole minibatch's normalisers (all ranks)
    ref_logp: torch.Tensor | None  # [N, C] reference log-probs, when beta > 0
    old_logp: tuple[torch.Tensor, ...] | None  # per micro-batch [n, c]: the generating policy's log-probs; None: the first epoch's own
    entropy_weights: torch.Tensor | None  # [N, C] top-entropy token selection; None with a quantile < 1: from the first epoch's forward
    sampled_entropy: torch.Tensor  # [2] float64: entropy sum and count of the sampled tokens known before the epochs
    entropy_from_first_epoch: bool  # the first epoch's forwards add the entropies of the rows they run to sampled_entropy
    cov_selection: torch.Tensor | None = None  # [N, C] Clip-Cov's weights or KL-Cov's selected tokens (algo.*_cov_ratio)
    skipped_entropy: torch.Tensor | None = None  # [2] float64: H sum and loss tokens of the rows skipped (adaptive_entropy)

    @property
    def micro_batch_sizes(self) -> list[int]:
        return [mb.rows.stop - mb.rows.start for mb in self.micro_batches if mb.weight]

    def after_first_epoch(self, first: FirstEpoch) -> MinibatchInputs:
        """The inputs of the epochs after the first: what the first took from its own forwards filled in."""
        return self._replace(
            old_logp=tuple(first.logp) if self.old_logp is None else self.old_logp,
            entropy_weights=first.entropy_weights if self.entropy_weights is None else self.entropy_weights,
        )


@dataclass
class FirstEpoch:
    """What a minibatch's first epoch takes from its own forwards, where its inputs leave it unset to save a forward:
    the old log-probs of a minibatch trained before any optimizer step without dropout (all its micro-batches run
    before its optimizer step, so they are the generating policy's: the ratio is exactly 1 in the first epoch), and
    the top-entropy selection of a minibatch of one micro-batch (its forward covers the whole minibatch)."""

    logp: list[torch.Tensor] = field(default_factory=list)  # per micro-batch [n, c], detached
    entropy_weights: torch.Tensor | None = None  # [N, C]


class RowsToRun(NamedTuple):
    """Which rows of this rank's share the update runs, in which order and micro-batches (N rows, C tokens)."""

    keep: torch.Tensor | None  # [N] the share's rows run, in order (None: all, as they are)
    episodes: Episodes  # N episodes on the training device
    advantages: torch.Tensor  # [N] float32
    loss_mask: torch.Tensor  # [N, C] float32
    slices: list[slice]  # this rank's micro-batches
    micro_batch_size: int
    micro_batches: tuple[MicroBatch, ...]  # the slices, then the lockstep repeats
    norms: algo.BatchNorms
    left_out_mask: torch.Tensor | None = None  # [n, C] the loss mask of the rows left out (None: every row runs)


@dataclass
class UpdateResult:
    metrics: dict
    micro_batch_sizes: list[int]  # rows per forward/backward this step ran (this rank)
    skipped: bool  # a non-finite loss or gradient: the weights were not touched


def old_logprobs(minibatch: MinibatchInputs, i: int, out, first: FirstEpoch | None) -> tuple[torch.Tensor, bool]:
    """(micro-batch i's old log-probs, whether they are this very forward's: ratio exactly 1, nothing clips)."""
    if minibatch.old_logp is not None:
        return minibatch.old_logp[i], False
    assert first is not None, "later epochs get the old log-probs from the first (after_first_epoch)"
    if i < len(first.logp):  # a lockstep repeat of the last micro-batch: the log-probs its first run took
        return first.logp[i], False
    first.logp.append(out.logp.detach())
    return first.logp[i], True
