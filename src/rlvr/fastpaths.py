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
