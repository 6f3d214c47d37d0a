"""Per-token log-probs and entropy from logits, without a full log-softmax copy of the logits.

selective_log_softmax and token_entropy(_with_grad) are the plain ops: the compiled training forward runs them
(inductor fuses them into its own kernels). token_logprobs is the same math as one autograd node, hand-fused: the
eager forward runs it."""

from __future__ import annotations

from typing import Any

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


# ---------------------------------------------------------------------------------------------
# the eager training forward's: log-probs and entropy in one pass per chunk, one backward node

CHUNK_BYTES = 4 << 20  # one fp32 work buffer of a chunk: a few MB, so the chunk's passes over it run from the caches


def chunk_tokens(vocab: int) -> int:
    """Tokens per chunk for `vocab`: CHUNK_BYTES of fp32 rows, at least 8 (per-chunk dispatch stays small at 150k)."""
    return max(8, CHUNK_BYTES // (4 * vocab))


def token_logprobs(
    logits: torch.Tensor,  # [N, L, V], any float dtype (bf16 under autocast)
    index: torch.Tensor,  # [N, L] the tokens whose log-probs are wanted
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,  # the entropy differentiable (an entropy bonus), else a constant
    chunk: int | None = None,  # tokens per chunk (default chunk_tokens(V))
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(logits / T)[index] [N, L] and, with_entropy, the entropy of softmax(logits / T) [N, L], both in
    fp32 (fp64 for fp64 logits) and differentiable with respect to `logits` (the entropy only with entropy_grad).

    selective_log_softmax + token_entropy's math as one autograd node, chunked over the N x L tokens:
        x = logits / T   (fp32)    m = max x    e = exp(x - m)    Z = sum e    lse = m + log Z
        logp  = x[index] - lse                                    (selective_log_softmax's bits: the same ops)
        H     = log Z - sum(e (x - m)) / Z                        (= -sum p log p, two nonnegative terms)
        dlogp / dx_j = [j = index] - p_j        dH / dx_j = -p_j (log p_j + H)        log p_j = (x_j - m) - log Z
    The forward keeps only m and log Z (and H) besides the logits themselves, and the backward recomputes p chunk by
    chunk (log p as (x - m) - log Z: x - lse would round at lse's magnitude, 3x the plain ops' error at T 0.7);
    autograd's graph of the separate ops kept an fp32 copy of the logits and made about twenty passes over [N, L, V]
    tensors forward and backward (six here), each chunk's a fresh allocation. Config V of bench/floor.py (vocabulary
    32000): bench/results/logprobs_vocab_amd.md. T divides in fp32 (bf16 logits too), as the sampler divides its
    fp32 logits, and its gradient folds into the backward's scale."""
    entropy_grad = entropy_grad and with_entropy
    logp, entropy = _TokenLogProbs.apply(logits, index, temperature, with_entropy, entropy_grad, chunk or chunk_tokens(logits.shape[-1]))
    return logp, entropy if with_entropy else None


class _TokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, index: torch.Tensor, temperature: float, with_entropy: bool, entropy_grad: bool, chunk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        N, L, V = logits.shape
        rows, idx = logits.reshape(N * L, V), index.reshape(N * L, 1)  # [T, V], [T, 1]
        f32 = _at_least_fp32(logits.dtype)
        shift = logits.new_empty(2, N * L, dtype=f32)  # m and log Z per token: the backward's log p = (x - m) - log Z
        logp, entropy = torch.empty_like(shift[0]), torch.empty_like(shift[0]) if with_entropy else shift.new_empty(0)
        x_buf = logits.new_empty(2, min(chunk, N * L), V, dtype=f32)  # x and e of every chunk: no fresh pages per chunk
        for a in range(0, N * L, chunk):
            b = min(a + chunk, N * L)
            x = _scaled(rows[a:b], temperature, x_buf[0, : b - a])  # [c, V]
            m = x.amax(-1, keepdim=True)  # [c, 1]
            picked = x.gather(-1, idx[a:b])  # [c, 1]
            s = x.sub_(m)  # x - m, in place
            e = torch.exp(s, out=x_buf[1, : b - a])  # [c, V]
            z = e.sum(-1, keepdim=True)
            log_z = z.log()
            shift[0, a:b], shift[1, a:b] = m.squeeze(-1), log_z.squeeze(-1)
            logp[a:b] = (picked - (log_z + m)).squeeze(-1)  # logsumexp's own order: log(sum(exp(x - m))) + m
            if with_entropy:
                entropy[a:b] = (log_z - e.mul_(s).sum(-1, keepdim=True) / z).squeeze(-1)
        ctx.save_for_backward(logits, index, shift, entropy if entropy_grad else None)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.set_materialize_grads(False)
        logp, entropy = logp.view(N, L), entropy.view(N, L) if with_entropy else entropy
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor | None, g_entropy: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        # g_logp, g_entropy [N, L], or None where the loss did not use that output
        logits, index, shift, entropy = ctx.saved_tensors
        N, L, V = logits.shape
        rows, idx = logits.reshape(N * L, V), index.reshape(N * L, 1)
        T, chunk = ctx.temperature, ctx.chunk
        f32 = shift.dtype
        g = shift.new_zeros(N * L, 1) if g_logp is None else g_logp.reshape(N * L, 1).to(f32) / T  # d/dlogits = d/dx / T
        gh = None if entropy is None or g_entropy is None else g_entropy.reshape(N * L, 1).to(f32) / T
        m, log_z = shift[:, :, None]  # [T, 1] each
        grad = torch.empty_like(rows)  # [T, V] in the logits' dtype
        buf = rows.new_empty(min(chunk, N * L), V, dtype=f32)
        for a in range(0, N * L, chunk):
            b = min(a + chunk, N * L)
            log_p = _scaled(rows[a:b], T, buf[: b - a]).sub_(m[a:b]).sub_(log_z[a:b])  # [c, V]
            if gh is None:  # -p g + [j = index] g
                d = log_p.exp_().mul_(-g[a:b])
            else:  # -p (g + gh (log p + H)) + [j = index] g
                coef = (log_p + entropy[a:b, None]).mul_(gh[a:b]).add_(g[a:b])
                d = log_p.exp_().mul_(coef).neg_()
            grad[a:b] = d.scatter_add_(-1, idx[a:b], g[a:b])
        return grad.view(N, L, V), None, None, None, None, None


def _scaled(rows: torch.Tensor, temperature: float, out: torch.Tensor) -> torch.Tensor:
    """rows / temperature in out's dtype (fp32 for bf16 rows: dividing by a one-element fp32 tensor promotes)."""
    if temperature == 1.0:
        return out.copy_(rows)
    return torch.div(rows, torch.full((1,), temperature, dtype=out.dtype, device=out.device), out=out)
