"""Per-token log-probs and entropy from logits, without a full log-softmax copy of the logits.

selective_log_softmax and token_entropy(_with_grad) are the plain ops: the compiled training forward runs them
(inductor fuses them into its own kernels). token_logprobs is the same math as one autograd node, hand-fused: the
eager forward runs it."""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch


def exp_flushed(
    s: torch.Tensor, out: torch.Tensor | None = None, *, lowest: float | None = None, clamp_in_place: bool = False
) -> torch.Tensor:
    """exp(s), with the results at or below e x the smallest normal number of s's dtype, or of fp32 if that is
    smaller (3.2e-38 in fp32, bf16 and fp16: s <= log(tiny) + 1 = -86.34), flushed to 0.

    Why: on the CPU torch's exp takes 40-140x as long per element whose result underflows (a subnormal or 0; an
    input of -inf too) as per element whose result is normal: [64, 49152] shifted logits spread over 200 nats 34 ms
    instead of 0.5 (Intel Xeon, 2 threads; bench/results/exp_underflow_intel.md). Shifted logits x - max x reach
    there wherever a row's logits span more than 87 nats at the temperature: a confident model, a low temperature,
    a top-k/top-p filter's -inf. There exp runs on s clamped at the cut (normal results, full speed) and the clamped
    entries become 0: every result above the cut is exp's own bits, and the flushed ones lie far below the rounding
    of any sum that holds exp(0) = 1, as a softmax's does (x - max x), so sums, log-probs and sampling see no
    difference but that a token of probability below 3.2e-38 is never drawn. Where nothing is that low (a pass over
    s to tell, unless the caller knows `lowest`: s's least value, or a bound below it; a NaN keeps torch's exp), and
    off the CPU, it is torch.exp. `out` may be s itself (in place). clamp_in_place (without `out`): s is the caller's
    scratch, clamped at the cut in place where it must be (the entries raised to the cut give 0 either way) and exp
    written to a new tensor, rather than a clamped copy exp'd in place: the same bits, one fresh tensor either way, but
    the clamp passes over memory in cache (in a 49k-vocabulary decode step a clamp into a new tensor took 0.97 ms, an
    in-place pass 0.45: bench/results/sampler_in_place_intel.md)."""
    cut, at_cut = _flush_cut(s.dtype) if s.is_floating_point() else (None, 0.0)
    if cut is None or s.device.type != "cpu" or s.numel() == 0 or not (float(s.amin()) if lowest is None else lowest) <= cut:
        return torch.exp(s) if out is None else torch.exp(s, out=out)
    if clamp_in_place and out is None:
        return torch.threshold_(torch.exp(s.clamp_min_(cut)), at_cut, 0.0)  # exp(cut) and below -> 0
    clamped = s.clamp_min(cut) if out is None else torch.clamp_min(s, cut, out=out)
    return torch.threshold_(clamped.exp_(), at_cut, 0.0)


_FLUSH_CUTS: dict[torch.dtype, tuple[float, float]] = {}


def _flush_cut(dtype: torch.dtype) -> tuple[float, float]:
    """(the cut of exp_flushed for dtype, exp of the cut as exp computes it in dtype). The smallest normal of fp32 at
    least: fp16's exp computes in fp32 (its own smallest normal, 6e-5, would flush probabilities that count)."""
    if dtype not in _FLUSH_CUTS:
        cut = math.log(torch.finfo(torch.promote_types(dtype, torch.float32)).tiny) + 1.0
        _FLUSH_CUTS[dtype] = (cut, float(torch.tensor(cut, dtype=dtype).exp()))
    return _FLUSH_CUTS[dtype]


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

GRAD_IN_LOGITS = True  # False: grad_in_logits ignored, every gradient a new tensor (bench/logprobs_in_place_ab.py)
E_OVER_Z = True  # the backward's p as the forward's e over Z (x - m, exp, one product); False: exp((x - m) - log Z), a
# pass more (bench/logprobs_in_place_ab.py's "before")
CHUNK_BYTES = 4 << 20  # one fp32 work buffer of a chunk: a few MB, so the chunk's passes over it run from the caches


def chunk_tokens(vocab: int) -> int:
    """Tokens per chunk for `vocab`: CHUNK_BYTES of fp32 rows, at least 8 (per-chunk dispatch stays small at 150k)."""
    return max(8, CHUNK_BYTES // (4 * vocab))


def token_logprobs(
    logits: torch.Tensor,  # [N, L', V], L' >= L, any float dtype (bf16 under autocast), any strides
    index: torch.Tensor,  # [N, L] the tokens whose log-probs are wanted: position l of logits scores index[:, l]
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,  # the entropy differentiable (an entropy bonus), else a constant
    chunk: int | None = None,  # tokens per chunk (default chunk_tokens(V))
    grad_in_logits: bool = False,  # the logits are the caller's temporary: their gradient is written over them
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(logits / T)[index] [N, L] and, with_entropy, the entropy of softmax(logits / T) [N, L], both in
    fp32 (fp64 for fp64 logits) and differentiable with respect to `logits` (the entropy only with entropy_grad).
    Positions past L (a forward's last, which predicts past the completion) are read by nothing and get gradient 0:
    slicing them off would copy the logits, and slicing's backward would write a zero-filled copy of them.

    selective_log_softmax + token_entropy's math as one autograd node, chunked over the N x L tokens:
        x = logits / T   (fp32)    m = max x    e = exp(x - m)    Z = sum e    lse = m + log Z
        logp  = x[index] - lse                                    (selective_log_softmax's bits: the same ops)
        H     = log Z - sum(e (x - m)) / Z                        (= -sum p log p, two nonnegative terms)
        dlogp / dx_j = [j = index] - p_j        dH / dx_j = -p_j (log p_j + H)        log p_j = (x_j - m) - log Z
    The forward keeps only m and log Z (and H) besides the logits themselves, and the backward recomputes p chunk by
    chunk: as exp(x - m) / Z, the forward's e in three passes over the chunk (x - m, exp, the product by -g / Z), or
    where the entropy has a gradient, through log p as (x - m) - log Z (x - lse would round at lse's magnitude, 3x
    the plain ops' error at T 0.7);
    autograd's graph of the separate ops kept an fp32 copy of the logits and made about twenty passes over [N, L, V]
    tensors forward and backward (six here), each chunk's a fresh allocation: 7-8x faster at 32k-152k vocabularies
    (bench/results/logprobs_vocab_amd.md), config V's training 2.2x -> 1.6x its floor (bench/results/floor_vocab_amd.md).
    T divides in fp32 (bf16 logits too), as the sampler divides its fp32 logits, and its gradient folds into the
    backward's scale.

    grad_in_logits: nothing reads the logits after this node's backward (a forward's own output that only this node
    takes, as the training forward's), so the backward writes each block's gradient over the block once it has read
    it, instead of into a new [N, L', V] tensor: at a 152k vocabulary that tensor is hundreds of MB of fresh pages,
    faulted in one by one as the gradient is written (a tensor that saved the logits for another backward fails
    autograd's in-place check there rather than reading the gradient as logits). Contiguous logits only: others
    (a repeated row's expanded view) get a new tensor."""
    entropy_grad = entropy_grad and with_entropy
    chunk = chunk or chunk_tokens(logits.shape[-1])
    in_logits = grad_in_logits and GRAD_IN_LOGITS and logits.is_contiguous()
    logp, entropy = _TokenLogProbs.apply(logits, index, temperature, with_entropy, entropy_grad, chunk, in_logits)
    return logp, entropy if with_entropy else None


def _blocks(N: int, L: int, chunk: int) -> Iterator[tuple[slice, slice]]:
    """(rows, positions) slices covering [N, L] in blocks of at most `chunk` tokens: whole rows together, or one row
    in pieces where a row is longer than a chunk."""
    if L >= chunk:
        for r in range(N):
            for p in range(0, L, chunk):
                yield slice(r, r + 1), slice(p, min(p + chunk, L))
    elif L > 0:
        for r in range(0, N, chunk // L):
            yield slice(r, min(r + chunk // L, N)), slice(0, L)


class _TokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        index: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool,
        chunk: int,
        grad_in_logits: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        (N, L), V = index.shape, logits.shape[-1]
        f32 = _at_least_fp32(logits.dtype)
        shift = logits.new_empty(2, N, L, dtype=f32)  # m and log Z per token: the backward's log p = (x - m) - log Z
        logp, entropy = torch.empty_like(shift[0]), torch.empty_like(shift[0]) if with_entropy else shift.new_empty(0)
        x_buf = logits.new_empty(2, min(chunk, N * L), V, dtype=f32)  # x and e of every chunk: no fresh pages per chunk
        lowest = []  # per chunk, its least x - m: the backward's exp_flushed needs no pass to find its own bound
        for r, p in _blocks(N, L, chunk):
            block = logits[r, p]  # [n, l, V]
            c = block.shape[0] * block.shape[1]
            s, m, picked = _shifted(block, index[r, p], temperature, x_buf[0, :c].view(block.shape))  # [c, V], [c, 1], [c, 1]
            lowest.append(float(s.amin()))  # the backward's bound below its log p (there: less log Z <= log V)
            e = exp_flushed(s, out=x_buf[1, :c], lowest=lowest[-1])  # [c, V]
            z = e.sum(-1, keepdim=True)
            log_z = z.log()
            shift[0, r, p], shift[1, r, p] = m.view(block.shape[:2]), log_z.view(block.shape[:2])
            logp[r, p] = (picked - (log_z + m)).view(block.shape[:2])  # logsumexp's own order: log(sum(exp(x - m))) + m
            if with_entropy:
                entropy[r, p] = (log_z - e.mul_(s).sum(-1, keepdim=True) / z).view(block.shape[:2])
        ctx.save_for_backward(logits, index, shift, entropy if entropy_grad else None)
        ctx.temperature, ctx.chunk, ctx.lowest, ctx.grad_in_logits = temperature, chunk, lowest, grad_in_logits
        ctx.set_materialize_grads(False)
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor | None, g_entropy: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        # g_logp, g_entropy [N, L], or None where the loss did not use that output
        logits, index, shift, entropy = ctx.saved_tensors
        (N, L), V = index.shape, logits.shape[-1]
        T, chunk = ctx.temperature, ctx.chunk
        f32 = shift.dtype
        g = shift.new_zeros(N, L) if g_logp is None else g_logp.to(f32) / T  # d/dlogits = d/dx / T
        gh = None if entropy is None or g_entropy is None else g_entropy.to(f32) / T
        grad = logits if ctx.grad_in_logits else logits.new_empty(logits.shape)  # [N, L', V] in the logits' dtype
        grad[:, L:] = 0  # positions past L: read by nothing
        # fp32 logits: each block's work runs in its own slice of the gradient (no copy into it after; over the block
        # itself with grad_in_logits, every entry read before it is written); else in fp32
        buf = None if grad.dtype == f32 else logits.new_empty(min(chunk, N * L), V, dtype=f32)
        neg_g_over_z = g.neg().mul_(shift[1].neg().exp()) if gh is None and E_OVER_Z else None  # [N, L] -g / Z
        for (r, p), lowest in zip(_blocks(N, L, chunk), ctx.lowest):
            block = logits[r, p]  # [n, l, V]
            work = grad[r, p] if buf is None else buf[: block.shape[0] * block.shape[1]].view(block.shape)  # [n, l, V]
            s = _minus(block, T, _column(shift[0], r, p), work)  # x - m
            if neg_g_over_z is not None:  # -p g + [j = index] g with p = e / Z, e = exp(x - m) the forward's own bits
                d = exp_flushed(s, out=s, lowest=lowest).mul_(_column(neg_g_over_z, r, p))
            elif gh is None:
                log_p = s.sub_(_column(shift[1], r, p))  # (x - m) - log Z
                d = exp_flushed(log_p, out=log_p, lowest=lowest - math.log(V)).mul_(-_column(g, r, p))
            else:  # -p (g + gh (log p + H)) + [j = index] g
                log_p = s.sub_(_column(shift[1], r, p))
                lowest -= math.log(V)  # log Z <= log V
                coef = (log_p + _column(entropy, r, p)).mul_(_column(gh, r, p)).add_(_column(g, r, p))
                d = exp_flushed(log_p, out=log_p, lowest=lowest).mul_(coef).neg_()
            d.scatter_add_(-1, _column(index, r, p), _column(g, r, p))
            if buf is not None:
                grad[r, p] = d
        return grad, None, None, None, None, None, None


def _column(t: torch.Tensor, rows: slice, positions: slice) -> torch.Tensor:
    """A block's [n, l] of a per-token tensor [N, L] as [n, l, 1]."""
    return t[rows, positions].unsqueeze(-1)


def _shifted(block: torch.Tensor, index: torch.Tensor, temperature: float, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(s = x - max x [c, V] in `out`, max x [c, 1], x[index] [c, 1]) of x = block / T in fp32: block [n, l, V], index
    [n, l], out [n, l, V] fp32, c = n x l."""
    n, l, V = block.shape
    direct = _direct(block, temperature, out)
    x = block if direct else _scaled(block, temperature, out)
    m = x.amax(-1, keepdim=True)  # [n, l, 1]
    picked = x.gather(-1, index.unsqueeze(-1))  # [n, l, 1]
    s = torch.sub(block, m, out=out) if direct else x.sub_(m)  # x - m
    return s.view(n * l, V), m.view(n * l, 1), picked.view(n * l, 1)


def _minus(block: torch.Tensor, temperature: float, m: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """block / T - m in `out` (fp32, any strides): block [n, l, V], m [n, l, 1]."""
    return torch.sub(block, m, out=out) if _direct(block, temperature, out) else _scaled(block, temperature, out).sub_(m)


def _direct(block: torch.Tensor, temperature: float, out: torch.Tensor) -> bool:
    """Whether x = block / T is the block itself (fp32 logits at T = 1), so that x - m goes straight into `out` in one
    pass, without a copy of the block there first. bf16 blocks are cast by that copy: a subtraction that casts as it
    goes ran 1.12x as long (bench/results/logprobs_copies_intel.md)."""
    return temperature == 1.0 and block.dtype == out.dtype


def _scaled(rows: torch.Tensor, temperature: float, out: torch.Tensor) -> torch.Tensor:
    """rows / temperature in out's dtype (fp32 for bf16 rows: dividing by a one-element fp32 tensor promotes)."""
    if temperature == 1.0:
        return out.copy_(rows)
    return torch.div(rows, torch.full((1,), temperature, dtype=out.dtype, device=out.device), out=out)
