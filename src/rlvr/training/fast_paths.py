"""Work the update can leave out or reorder without changing its result.

Whether a row with advantage exactly 0 has exactly zero gradient, and whether rows may be
regrouped into other micro-batches, are properties of the objective and the aggregation that
`rlvr.algo` declares (e.g. -min(r * 0, clip(r) * 0) = 0 in every epoch; `bnpo` normalises per
micro-batch); rlvr.training.batch_plan resolves them once. The loss normalisers come from the whole
batch (BatchNorms), so the other rows' gradients do not change.
"""

from __future__ import annotations

import torch


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
    lengths: torch.Tensor,  # [N] tokens after the prompt of each row
    groups: torch.Tensor,  # [N] group id of each row
    *,
    prompt_len: int,
    micro_batch_size: int,
    pieces: int | None,
    shared_prefix: bool,
) -> tuple[torch.Tensor, int] | None:
    """Packing without varlen kernels: rows sorted by length and cut into micro-batches (of
    micro_batch_size rows, or `pieces` equal ones), so that each is trimmed to its own longest
    row instead of the batch's. Returned as (row order, micro-batch size) when that computes
    fewer tokens than the rows as they are (micro_batch_size rows each, in group order, prompts
    shared); None otherwise (e.g. long prompts whose sharing would be lost). Gradients are the
    same: the losses' normalisers are the whole batch's."""
    N = len(lengths)
    size = -(-N // pieces) if pieces else micro_batch_size
    if N < 2 or (pieces is None and size >= N):
        return None
    asis = [torch.arange(i, min(i + micro_batch_size, N)) for i in range(0, N, micro_batch_size)]
    order = torch.sort(lengths, descending=True, stable=True).indices
    packed = [order[i : i + size] for i in range(0, N, size)]
    if _padded_cost(lengths, groups, packed, prompt_len, shared_prefix) < 0.9 * _padded_cost(
        lengths, groups, asis, prompt_len, shared_prefix
    ):
        return order, size
    return None


def update_rows(
    advantages: torch.Tensor,  # [N]
    lengths: torch.Tensor,  # [N] tokens after the prompt
    group_ids: torch.Tensor,  # [N]
    prompt_mask: torch.Tensor,  # [N, P]
    plan,  # rlvr.training.batch_plan.BatchPlan: which fast paths apply
    *,
    skip_zero_advantage: bool,  # this step leaves rows with advantage exactly 0 out (the plan's, or the controller's)
) -> tuple[torch.Tensor | None, int]:
    """Which rows the update runs, in which order (None: all, as they are), and the micro-batch size."""
    rows = None
    if skip_zero_advantage:
        rows = (advantages != 0).nonzero().squeeze(-1)
        if len(rows) == len(advantages):
            rows = None
    idx = torch.arange(len(advantages)) if rows is None else rows
    if not plan.pack_by_length or len(idx) < 2:
        return rows, plan.micro_batch_size
    P = int((prompt_mask.sum(0) > 0).sum())
    packed = length_sorted_order(
        lengths[idx],
        group_ids[idx],
        prompt_len=P,
        micro_batch_size=plan.micro_batch_size,
        pieces=plan.packing_pieces,
        shared_prefix=plan.shared_prefix,
    )
    if packed is None:
        return rows, plan.micro_batch_size
    order, size = packed
    return idx[order], size


def other_rows(rows: torch.Tensor, n: int) -> torch.Tensor:
    """The row indices in range(n) that are not in `rows`."""
    left = torch.ones(n, dtype=torch.bool)
    left[rows] = False
    return left.nonzero().squeeze(-1)


def masked_entropy_sum(entropy: torch.Tensor | None, mask: torch.Tensor | None) -> torch.Tensor:
    """[2] float64 (sum of the entropies [n, C'] over the tokens of mask [n, C], their count); (0, 0) for no rows."""
    if entropy is None or mask is None or len(mask) == 0:
        return torch.zeros(2, dtype=torch.float64)
    h, m = entropy.double().cpu(), mask[:, : entropy.shape[1]].double().cpu()
    return torch.stack([(h * m).sum(), m.sum()])
