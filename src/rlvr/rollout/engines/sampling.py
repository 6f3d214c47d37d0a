"""Sampling shared by the engines: top-k/top-p filtering, the hf engines' inverse-CDF sampler,
and the seed of each episode's noise."""

from __future__ import annotations

from typing import Literal, overload

import torch

from rlvr.algo import exp_flushed

SEED_RANGE = 2**63  # torch.Generator and vLLM take seeds below this


def row_seed(seed: int, sample: int, request: int | None = None) -> int:
    """The seed of sample `sample` of a prompt seeded `seed` (and of its `request`-th generation request,
    for an engine that makes one per model turn): the G samples of a prompt draw apart, and none
    depends on the batch it is in."""
    s = int(seed) * 9973 + sample
    if request is not None:
        s = s * 1009 + request
    return s % SEED_RANGE


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside top-k and outside the top-p nucleus with -inf."""  # logits: [N, V]
    drop = filtered_out(logits, top_k, top_p)
    return logits if drop is None else logits.masked_fill(drop, float("-inf"))


def filtered_out(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor | None:
    """[N, V] True outside top-k and outside the top-p nucleus of what top-k keeps; None when neither filters. Each
    row's most probable token always stays (top_p > 0)."""
    drop = None
    if top_k and top_k < logits.shape[-1]:
        drop = logits < torch.topk(logits, top_k, dim=-1).values[:, -1:]
    if top_p < 1.0:
        nucleus_out = outside_nucleus(logits if drop is None else logits.masked_fill(drop, float("-inf")), top_p)
        drop = nucleus_out if drop is None else drop | nucleus_out
    return drop


NUCLEUS_CANDIDATES = (64, 1024)  # a row's top-p nucleus is looked for among its K most probable tokens, K these in turn


def outside_nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """[n, V] True outside each row's top-p nucleus: the most probable tokens, in order, up to and including the one
    whose probability makes their total reach top_p. Looked for among each row's K most probable tokens (topk) for
    each K of NUCLEUS_CANDIDATES below a quarter of the vocabulary in turn, then by a sort of the rows still left: a
    sort of [64, 32000] takes 74 ms on the CPU (Intel Xeon, 2 threads), a topk of 64 3 ms, of 1024 11 ms
    (bench/results/top_p_intel.md: nuclei of a few tokens 8-20x faster, every row's nucleus past 1024 tokens
    1.12-1.24x slower). The probabilities are the unsorted row's softmax: a total within fp32's
    rounding of top_p (about 1e-5 over 152k tokens) may fall the other way than a sorted row's softmax would."""
    n, V = logits.shape
    probs = logits.softmax(-1)  # [n, V]
    drop = torch.ones_like(probs, dtype=torch.bool)
    rows = torch.arange(n, device=logits.device)  # the rows whose nucleus is still to be found
    for K in [k for k in NUCLEUS_CANDIDATES if 4 * k < V] + [V]:
        p = probs if len(rows) == n else probs[rows]  # [m, V]
        top, order = p.topk(K, dim=-1) if K < V else p.sort(dim=-1, descending=True)  # [m, K] most probable first
        out = top.cumsum(-1) - top >= top_p  # [m, K] the total before a token already reaches top_p
        found = out[:, -1] if K < V else torch.ones_like(rows, dtype=torch.bool)  # the nucleus ends among the K: all after are out
        outside = torch.ones(int(found.sum()), V, dtype=torch.bool, device=logits.device)
        drop[rows[found]] = outside.scatter_(-1, order[found], out[found])
        rows = rows[~found]
        if len(rows) == 0:
            break
    return drop


def sample_tokens(
    logits: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    entropy: bool = True,
    overwrite: bool = False,
):
    """One token per row by inverse-CDF sampling: the first token whose cumulative probability
    exceeds u * total, u ~ U[0, 1) given per row. Exact in distribution to fp32 rounding (each token's
    weight exp(x - max) in fp32, running totals in float64: inverse_cdf), a token of probability 0 never
    chosen, and one random number per row instead of one per row and vocabulary entry (the exponential
    race drew 49152 per row on SmolLM2: a fifth of its decode). Returns (token [n], its log-prob [n],
    entropy [n] or None where not asked for): the entropy of the whole distribution at this temperature (before
    top-k/top-p), by the training forward's formula (algo.token_logprobs: log Z - sum(e s) / Z, e = exp(s), s = x - max x).
    Z (of the log-prob, and of the entropy without top-k/top-p) is the total the draw measured u against: float64
    sums of fp32 sums of CDF_BLOCK weights, rounded to fp32.
    One exp over [n, V] where log_softmax, exp and a float64 cumsum of every entry made three passes and a
    float64 copy: [64, 32000] 2.2 ms against 7.5, [64, 151936] 12 against 106 (bench/results/sampling_vocab_amd.md).
    overwrite: the logits are the caller's own, not read again (a decode step's): they are scaled and shifted in place
    instead of into a new [n, V] tensor (the same bits)."""
    rows = max(1, SAMPLE_CHUNK // logits.shape[-1])
    if logits.shape[0] > rows:  # in row chunks: each chunk's [rows, V] temporaries come from the heap again and again
        chunks = zip(logits.split(rows), uniforms.split(rows))
        parts = [_sample_rows(x, u, temperature, top_k, top_p, entropy, overwrite) for x, u in chunks]
        return tuple(None if t[0] is None else torch.cat(t) for t in zip(*parts))
    return _sample_rows(logits, uniforms, temperature, top_k, top_p, entropy, overwrite)


IN_PLACE = True  # False: the logits left whole even where the caller allows overwriting, and the shifted logits clamped
# as a copy (bench/sampler_in_place_ab.py's "before")
Z_FROM_DRAW = True  # False: Z as a sum of its own over [n, V] (bench/sampler_total_ab.py's "before")
SAMPLE_CHUNK = 1 << 22  # logits per chunk of sample_tokens (16 MB in fp32): glibc maps a fresh, page-faulting block for
# every allocation past 32 MB, where a [64, 151936] fp32 temporary is 39 MB


def _sample_rows(
    logits: torch.Tensor, uniforms: torch.Tensor, temperature: float, top_k: int, top_p: float, with_entropy: bool, overwrite: bool
):
    """sample_tokens for one chunk of rows."""
    overwrite = overwrite and IN_PLACE
    # at temperature 1, s = logits - max without a copy of the logits first (a pass over [n, V] saved)
    scaled = logits if temperature == 1.0 else logits.div_(temperature) if overwrite else logits / temperature  # [n, V]
    drop = filtered_out(scaled, top_k, top_p) if top_k or top_p < 1.0 else None  # [n, V], before `scaled` is shifted
    s, e = _shifted_exp(scaled, in_place=overwrite or scaled is not logits)  # [n, V], [n, V]
    # the distribution the token is drawn from: the kept tokens' weights are e's own (the row's most probable token is
    # kept, so the kept logits' max is the row's), the bits a second exp of the filtered logits gave
    kept_e = e if drop is None else e.masked_fill(drop, 0.0)
    token, kept_total = inverse_cdf(kept_e, uniforms, with_total=True)  # [n], [n] float64
    # [n, 1] Z: the draw's own running total, rounded to fp32 (no pass over [n, V] for it)
    kept_z = kept_total.float()[:, None] if Z_FROM_DRAW else kept_e.sum(-1, keepdim=True)
    logp = (s.gather(-1, token[:, None]) - kept_z.log()).squeeze(-1)
    if not with_entropy:
        return token, logp, None
    z = kept_z if drop is None else e.sum(-1, keepdim=True)  # the whole distribution's
    entropy = (z.log() - torch.nansum(e.mul_(s), -1, keepdim=True) / z).squeeze(-1)  # nansum: 0 x -inf at -inf logits
    return token, logp, entropy


def _shifted_exp(x: torch.Tensor, *, in_place: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(s = x - max x, in place of x where in_place, e = exp(s)) over the last dim: x [n, V] -> [n, V], [n, V]."""
    m = x.amax(-1, keepdim=True)
    s = x.sub_(m) if in_place else x - m
    # a row spanning more than 87 nats: torch.exp's slow path on the CPU (algo.exp_flushed); s is ours (x's own or new),
    # and its entries clamped at the cut are read only where their weight is 0 (the entropy's e s: 0 either way)
    e = exp_flushed(s, clamp_in_place=IN_PLACE)
    return s, e


CDF_BLOCK = 64  # vocabulary entries per block of inverse_cdf's running total
DIRECT_CDF_MAX = 1024  # vocabularies up to this size: one float64 cumsum over all of it


@overload
def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor, with_total: Literal[False] = False) -> torch.Tensor: ...
@overload
def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor, with_total: Literal[True]) -> tuple[torch.Tensor, torch.Tensor]: ...
def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor, with_total: bool = False):
    """Per row the first index whose running total of `weights` [n, V] (>= 0, fp32) exceeds u x total (u [n] in
    [0, 1)), never an index of weight 0; with_total, also the total [n] (float64) the draw measured u against.
    Wide vocabularies in two levels instead of one float64 cumsum over [n, V] (a float64 copy of the weights and a
    sequential scan: 0.9 ms of a 32000-token decode step's 64 rows): sums of CDF_BLOCK weights in fp32 and their
    running total in float64 pick the block, then the block's own float64 cumsum picks the index; a block's sum
    rounds by at most 64 fp32 ulps of it, the only departure from the exact distribution (its own weight, not its
    neighbours')."""
    n, V = weights.shape
    target = uniforms.double()  # [n] times the total below: u < 1, so below the total (u x total rounds down from it)
    if V <= DIRECT_CDF_MAX:
        cdf = weights.double().cumsum(-1)  # [n, V]
        index = _first_above(cdf, target * cdf[:, -1])  # cdf[i] > target >= cdf[i - 1]: weight i is not 0
        return (index, cdf[:, -1]) if with_total else index
    full = V // CDF_BLOCK
    sums = weights[:, : full * CDF_BLOCK].view(n, full, CDF_BLOCK).sum(-1)  # [n, full]
    if V > full * CDF_BLOCK:  # the last, shorter block
        sums = torch.cat([sums, weights[:, full * CDF_BLOCK :].sum(-1, keepdim=True)], 1)
    cum = sums.double().cumsum(-1)  # [n, blocks]
    target = target * cum[:, -1]
    block = _first_above(cum, target)  # [n] a block of nonzero sum, as above
    before = cum.gather(-1, (block - 1).clamp_min(0)[:, None]).squeeze(-1).masked_fill_(block == 0, 0.0)  # total of the blocks before
    cols = block[:, None] * CDF_BLOCK + torch.arange(CDF_BLOCK, device=weights.device)  # [n, CDF_BLOCK]
    w = weights.gather(-1, cols.clamp_max(V - 1)).masked_fill_(cols >= V, 0.0)  # the block's weights, past V none
    i = _first_above(w.double().cumsum(-1), target - before)
    # the block's float64 total can round below its fp32 sum: a target past it takes the block's last nonzero weight
    last = CDF_BLOCK - 1 - (w > 0).flip(-1).int().argmax(-1)  # [n]
    index = block * CDF_BLOCK + torch.minimum(i, last)
    return (index, cum[:, -1]) if with_total else index


def _first_above(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The first index i with cdf[i] > target: cdf [n, K] running totals, target [n] -> [n]."""
    return torch.searchsorted(cdf, target[:, None], right=True).squeeze(-1)
