"""Work the update can leave out without changing its result.

With no KL term (beta = 0) and no top-entropy token selection, a completion whose advantage is
exactly 0 has a per-token loss of -min(r * 0, clip(r) * 0) = 0 at every pass, so its gradient is
exactly zero: its forward and backward can be skipped. The loss normalisers come from the whole
batch (BatchNorms), so the other rows' gradients do not change. `bnpo` normalises by the local
micro-batch's token count, which skipping would change, so it always runs every row.
"""

from __future__ import annotations

import torch


def rows_to_train(
    advantages: torch.Tensor,  # [N]
    *,
    enabled: bool,
    beta: float,
    loss_type: str,
    top_entropy_quantile: float,
) -> torch.Tensor | None:
    """Indices of the rows whose gradient can be non-zero, or None when every row must run."""
    if not enabled or beta != 0 or loss_type == "bnpo" or top_entropy_quantile < 1:
        return None
    keep = (advantages != 0).nonzero().squeeze(-1)
    return None if len(keep) == len(advantages) else keep


def fill_missing_grads(params) -> None:
    """After a step whose rows were all skipped: zero gradients (not None), so that AdamW still
    takes its step from the moments it has, as it would after a zero-gradient backward."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def _padded_cost(lengths: torch.Tensor, groups: torch.Tensor, chunks: list[torch.Tensor], prompt_len: int, shared: bool) -> int:
    """Tokens a forward over these micro-batches computes: rows x longest completion, plus the
    prompt once per group (shared prefix) or once per row."""
    cost = 0
    for c in chunks:
        prompts = len(torch.unique(groups[c])) if shared else len(c)
        cost += len(c) * int(lengths[c].max()) + prompts * prompt_len
    return cost


def length_sorted_order(
    lengths: torch.Tensor,  # [N] completion lengths (loss-mask sums)
    groups: torch.Tensor,  # [N] group id of each row
    *,
    prompt_len: int,
    micro_batch_size: int,
    shared_prefix: bool,
    pieces: int = 4,
) -> tuple[torch.Tensor, int] | None:
    """Packing without varlen kernels: rows sorted by completion length and cut into micro-batches,
    so that each is trimmed to its own longest completion instead of the batch's. Returned as
    (row order, micro-batch size) when that computes fewer tokens than the batch as it is (micro_batch_size
    rows, or the whole batch, in group order, with prompts shared); None otherwise (e.g. long prompts
    whose sharing would be lost). Gradients are the same: the losses' normalisers are the whole batch's."""
    N = len(lengths)
    size = micro_batch_size or -(-N // pieces)
    if N < 2 or size >= N and micro_batch_size:
        return None
    asis = [torch.arange(i, min(i + (micro_batch_size or N), N)) for i in range(0, N, micro_batch_size or N)]
    order = torch.sort(lengths, descending=True, stable=True).indices
    packed = [order[i: i + size] for i in range(0, N, size)]
    if _padded_cost(lengths, groups, packed, prompt_len, shared_prefix) < 0.9 * _padded_cost(lengths, groups, asis, prompt_len, shared_prefix):
        return order, size
    return None


def update_rows(
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, C] loss mask
    prompt_mask: torch.Tensor,  # [N, P]
    *,
    group_size: int,
    micro_batch_size: int,
    skip_zero_advantage: bool,
    pack_by_length: bool,
    shared_prefix: bool,
    beta: float,
    loss_type: str,
    top_entropy_quantile: float,
) -> tuple[torch.Tensor | None, int]:
    """Which rows the update runs, in which order (None: all, as they are), and the micro-batch size."""
    rows = rows_to_train(advantages, enabled=skip_zero_advantage, beta=beta, loss_type=loss_type,
                         top_entropy_quantile=top_entropy_quantile)
    idx = torch.arange(len(advantages)) if rows is None else rows
    # bnpo normalises per micro-batch and entropy selection wants one micro-batch: keep them as they are
    if not pack_by_length or loss_type == "bnpo" or top_entropy_quantile < 1 or len(idx) < 2:
        return rows, micro_batch_size
    P = int((prompt_mask.sum(0) > 0).sum())
    plan = length_sorted_order(mask[idx].sum(-1), idx // group_size, prompt_len=P, micro_batch_size=micro_batch_size,
                               shared_prefix=shared_prefix)
    if plan is None:
        return rows, micro_batch_size
    order, size = plan
    return idx[order], size
