"""Loss aggregations: per-token losses [N, L] -> this micro-batch's share of the batch loss [].

With l_it the per-token loss, m_it the loss mask, n_i = sum_t m_it, and the sizes of the *whole*
generation batch from BatchNorms (N_b completions, T_b tokens, L_max the generation length limit,
K micro-batches):

    grpo     (1 / N_b) sum_i (sum_t m_it l_it) / n_i          per-completion mean, then mean over completions (DeepSeekMath)
    bnpo     (1 / K) (sum_it m_it l_it) / (sum_it m_it)       token mean of the local micro-batch, micro-batches averaged
    dr_grpo  (sum_it m_it l_it) / (N_b * L_max)               (Dr. GRPO)
    dapo     (sum_it m_it l_it) / T_b                         token mean over the whole batch (DAPO)
    luspo    (1 / N_b) sum_i sum_t m_it l_it                  per-completion sum, then mean over completions (LUSPO:
                                                              GSPO's sequence loss scaled by the completion's length)

Each entry declares:

    normalises_per_micro_batch  its normaliser depends on which rows the micro-batch holds (bnpo:
                                sum_it m_it is the local token count). All others are sums of per-row
                                terms over whole-batch constants, so the losses of k micro-batches, of any
                                rows in any order, add up to the full batch's loss: gradient accumulation is
                                exact, and rows may be regrouped or (with zero gradient) left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch


class BatchNorms(NamedTuple):
    """Sizes of the whole generation batch (all micro-batches, all ranks) that losses divide by."""

    num_sequences: int  # completions in the batch
    num_tokens: int  # completion tokens in the batch (sum of the loss mask)
    max_completion_length: int  # the generation length limit (max_new_tokens)
    num_micro_batches: int = 1  # how many pieces the batch is split into for accumulation
    num_entropy_tokens: int | None = (
        None  # tokens the entropy bonus averages over: those the top-entropy selection keeps (None: num_tokens)
    )


@dataclass(frozen=True)
class Aggregation:
    """A loss aggregation and the property the trainer's fast paths rely on."""

    fn: Callable[[torch.Tensor, torch.Tensor, BatchNorms], torch.Tensor]  # (per_token [N, L], mask [N, L], norms) -> []
    normalises_per_micro_batch: bool


def aggregate_grpo(per_token: torch.Tensor, mask: torch.Tensor, norms: BatchNorms) -> torch.Tensor:
    """Mean over each completion's tokens, then mean over completions (DeepSeekMath):
    (1 / N_b) sum_i (sum_t m_it l_it) / n_i."""
    per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [N]
    return per_seq.sum() / norms.num_sequences  # []


def aggregate_bnpo(per_token: torch.Tensor, mask: torch.Tensor, norms: BatchNorms) -> torch.Tensor:
    """Token mean over the local (micro-)batch; micro-batches then averaged: (1 / K) sum m l / sum m."""
    return (per_token * mask).sum() / mask.sum().clamp(min=1) / norms.num_micro_batches  # []


def aggregate_dr_grpo(per_token: torch.Tensor, mask: torch.Tensor, norms: BatchNorms) -> torch.Tensor:
    """Sum over tokens divided by completions x max completion length (Dr. GRPO): sum m l / (N_b L_max)."""
    return (per_token * mask).sum() / (norms.num_sequences * norms.max_completion_length)  # []


def aggregate_dapo(per_token: torch.Tensor, mask: torch.Tensor, norms: BatchNorms) -> torch.Tensor:
    """Token mean over the whole generation batch (DAPO), every token weighing the same: sum m l / T_b."""
    return (per_token * mask).sum() / max(norms.num_tokens, 1)  # []


def aggregate_luspo(per_token: torch.Tensor, mask: torch.Tensor, norms: BatchNorms) -> torch.Tensor:
    """Sum over each completion's tokens, then mean over completions (LUSPO): (1 / N_b) sum_i sum_t m_it l_it.
    With sequence-level ratios every token of completion i has the same l_i, so each completion weighs n_i l_i."""
    return (per_token * mask).sum() / norms.num_sequences  # []


# Keyed by the aggregation names LOSS_TYPES (losses.py) refer to.
LOSS_AGGREGATIONS: dict[str, Aggregation] = {
    "grpo": Aggregation(aggregate_grpo, normalises_per_micro_batch=False),
    "bnpo": Aggregation(aggregate_bnpo, normalises_per_micro_batch=True),
    "dr_grpo": Aggregation(aggregate_dr_grpo, normalises_per_micro_batch=False),
    "dapo": Aggregation(aggregate_dapo, normalises_per_micro_batch=False),
    "luspo": Aggregation(aggregate_luspo, normalises_per_micro_batch=False),
}
