"""Per-token log-probs and entropy from logits, without a full log-softmax copy of the logits."""

from __future__ import annotations

import torch


def _at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _chunks(x: torch.Tensor, chunk_rows: int | None) -> tuple[torch.Tensor, ...]:
    """x in chunks of chunk_rows rows; None: one chunk (under torch.compile, where the row count is
    symbolic and the fused kernels keep no temporary of the chunk's size anyway)."""
    return (x,) if chunk_rows is None else x.split(chunk_rows)


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor, chunk_rows: int | None = 16) -> torch.Tensor:
    """log_softmax(logits)[..., index] computed as logit[index] - logsumexp(logits).

    logits: [N, L, V], index: [N, L] -> [N, L]. Rows are processed in chunks so that the
    temporary of the logsumexp is at most [chunk_rows, L, V]; no [N, L, V] log-softmax
    tensor is ever materialised. fp32 math even for bf16 logits (bf16 log-softmax is lossy);
    fp64 logits stay fp64.
    """
    out = []
    for lg, ix in zip(_chunks(logits, chunk_rows), _chunks(index, chunk_rows)):
        lg = lg.to(_at_least_fp32(lg.dtype))  # [chunk, L, V]
        picked = lg.gather(-1, ix.unsqueeze(-1)).squeeze(-1)
        out.append(picked - torch.logsumexp(lg, dim=-1))
    return torch.cat(out)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, chunk_rows: int | None = 16) -> torch.Tensor:
    """Entropy of each position's distribution: [N, L, V] -> [N, L] (no gradient)."""
    out = []
    for lg in _chunks(logits, chunk_rows):
        logp = lg.to(_at_least_fp32(lg.dtype)).log_softmax(-1)  # [chunk, L, V]
        out.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(out)


def token_entropy_with_grad(logits: torch.Tensor, chunk_rows: int | None = 16) -> torch.Tensor:
    """Entropy of each position's distribution, differentiable: [N, L, V] -> [N, L] (the entropy bonus).
    Autograd keeps each chunk's log-softmax for the backward: an [N, L, V] fp32 tensor in all."""
    out = []
    for lg in _chunks(logits, chunk_rows):
        logp = lg.to(_at_least_fp32(lg.dtype)).log_softmax(-1)  # [chunk, L, V]
        out.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(out)
