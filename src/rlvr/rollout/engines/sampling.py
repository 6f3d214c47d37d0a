"""Sampling shared by the engines: top-k/top-p filtering, the hf engines' inverse-CDF sampler,
and the seed of each episode's noise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, overload

import torch

from rlvr.algo import exp_flushed
from rlvr.rollout.engines import native_sampler

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
    drop = outside_top_k(logits, top_k)
    if top_p < 1.0:
        nucleus_out = outside_nucleus(logits if drop is None else logits.masked_fill(drop, float("-inf")), top_p)
        drop = nucleus_out if drop is None else drop | nucleus_out
    return drop


def outside_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor | None:
    """[N, V] True below each row's top_k-th largest logit; None where top_k keeps every token (0 or >= V)."""
    V = logits.shape[-1]
    if not top_k or top_k >= V:
        return None
    top = _heaviest(logits, top_k)[0] if 4 * top_k * CDF_BLOCK <= V else torch.topk(logits, top_k, dim=-1).values
    return logits < top[:, -1:]


def outside_nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """[n, V] True outside each row's top-p nucleus (nucleus_outside) of softmax(logits); -inf logits weigh 0."""
    s = logits - logits.amax(-1, keepdim=True)  # [n, V]
    return nucleus_outside(s, exp_flushed(s, clamp_in_place=True), top_p)


NUCLEUS_CANDIDATES = 64  # a row's nucleus is first looked for among its K most probable tokens (0: straight to the bins)
NUCLEUS_BINS_PER_NAT = 64  # then by tokens binned by x - max x in steps of 1/64 nat
NUCLEUS_SPAN = 88  # nats binned below the max; anything lower shares the last bin (fp32 weights there are 0 or ~1e-38)


def nucleus_outside(s: torch.Tensor, e: torch.Tensor, top_p: float) -> torch.Tensor:
    """[n, V] True outside each row's top-p nucleus: the most probable tokens, in order (the lower index first among
    tied weights), up to and including the one whose weight makes their total reach top_p of the row's total.
    e [n, V] the weights (>= 0, 0 where an earlier filter dropped a token), s [n, V] = x - max x the logits they are
    exp of (<= 0, any value where e is 0).

    Without a sort of the row: first among the row's NUCLEUS_CANDIDATES heaviest tokens (_heaviest), where a language
    model's nucleus of a few tokens ends; the other rows by bins (_binned_nucleus). At [64, 152k] on the CPU (Intel
    Xeon, 2 threads) a sort of every row took ~450 ms, topk candidates then a sort of the rows left (before) ~22 ms
    for nuclei of a few tokens and ~500 ms past 1024; this 19-21 and 70-112 ms (bench/results/top_p_intel.md). The
    totals are float64 over fp32 sums in another order than a sorted row's softmax: a total within fp32's rounding
    of top_p (about 1e-5 over 152k tokens) may fall the other way."""
    n, V = e.shape
    if not NUCLEUS_CANDIDATES or 4 * NUCLEUS_CANDIDATES >= V:
        return _binned_nucleus(s, e, top_p)
    found, found_drop = _nucleus_among_heaviest(e, top_p, NUCLEUS_CANDIDATES)
    if bool(found.all()):
        return found_drop
    rest = (~found).nonzero().squeeze(1)
    drop = torch.empty(n, V, dtype=torch.bool, device=e.device)
    drop[found] = found_drop
    drop[rest] = _binned_nucleus(s[rest], e[rest], top_p)
    return drop


def _nucleus_among_heaviest(e: torch.Tensor, top_p: float, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([n] whether the row's nucleus ends among its K heaviest tokens, [f, V] outside it for those f rows): the
    nucleus ends there when one of the K is out, and no token tied with its last token is left outside the K."""
    top, idx = _heaviest(e, K)  # [n, K]; tied weights in any order
    idx, by_index = idx.sort(-1)
    top, by_weight = top.gather(-1, by_index).sort(dim=-1, descending=True, stable=True)  # the lower index first among ties
    idx = idx.gather(-1, by_weight)
    target = top_p * e.sum(-1, keepdim=True).double()  # [n, 1]
    w = top.double()
    out = w.cumsum(-1) - w >= target  # [n, K] the weight before a token already reaches the target
    last = (~out).sum(-1, keepdim=True) - 1  # [n, 1] the nucleus's last token among the K (the first is always in)
    found = out[:, -1] & (top.gather(-1, last) > top[:, -1:]).squeeze(1)  # [n]
    drop = torch.ones(int(found.sum()), e.shape[1], dtype=torch.bool, device=e.device)
    return found, drop.scatter_(-1, idx[found], out[found])


def _heaviest(e: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) [n, K] of each row's K largest entries of e [n, V] (topk's values; ties at the K-th in any
    order), from the K blocks of CDF_BLOCK entries with the largest maxima: every entry above the K-th largest block
    maximum lies in one of them, and they hold at least K entries that large. At [64, 152k] 2.3 ms for K = 20 and 4.0
    for 50 where topk took 12 (Intel Xeon, 2 threads)."""
    maxima = _per_block(e, lambda b: b.amax(-1))  # [n, blocks]
    blocks = maxima.topk(min(K, maxima.shape[1]), dim=-1).indices  # [n, K']
    cols, past = _block_columns(blocks, e.shape[1])  # [n, K', B]
    w = e.gather(-1, cols.flatten(1)).masked_fill_(past.flatten(1), float("-inf"))  # [n, K' x B] past V: below every entry
    top, at = w.topk(K, dim=-1)
    return top, cols.flatten(1).gather(-1, at)


def _binned_nucleus(s: torch.Tensor, e: torch.Tensor, top_p: float) -> torch.Tensor:
    """nucleus_outside by bins: the tokens binned by s (NUCLEUS_BINS_PER_NAT a nat, the most probable in bin 0) and each
    bin's weight summed (scatter_add), whose running total finds the bin where the nucleus ends: every token of a bin
    before it is in, every token of a bin after it out, and only that edge bin's tokens are sorted."""
    n, V = e.shape
    bins = NUCLEUS_SPAN * NUCLEUS_BINS_PER_NAT + 1
    depth = torch.mul(s, -NUCLEUS_BINS_PER_NAT).clamp_(0, bins - 1).long()  # [n, V] the token's bin (floor: >= 0)
    mass = e.new_zeros(n, bins).scatter_add_(1, depth, e).double().cumsum(1)  # [n, bins] running total by bin
    target = top_p * mass[:, -1:]  # [n, 1]
    edge = torch.searchsorted(mass, target).clamp_max_(bins - 1)  # [n, 1] the first bin whose running total reaches it
    before_edge = mass.gather(1, (edge - 1).clamp_min(0)).masked_fill_(edge == 0, 0.0).squeeze(1)  # [n]
    drop = depth > edge  # [n, V] the bins after the edge's
    rows, cols = _edge_tokens(depth, edge)
    w = e[rows, cols].double()
    order = torch.sort(w, descending=True, stable=True).indices  # by weight, the lower index first among ties ...
    order = order[torch.sort(rows[order], stable=True).indices]  # ... within each row
    rows, cols, w = rows[order], cols[order], w[order]
    running = w.cumsum(0)  # over all rows' edge tokens: less the rows before's own total
    row_total = torch.zeros(n, dtype=w.dtype, device=w.device).index_add_(0, rows, w)
    before = before_edge[rows] + running - w - (row_total.cumsum(0) - row_total)[rows]  # the weight before each token
    out = before >= target.squeeze(1)[rows]
    drop[rows[out], cols[out]] = True
    return drop


def _edge_tokens(depth: torch.Tensor, edge: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) of the tokens in each row's edge bin (depth [n, V] == edge [n, 1]), in row-major order: the
    blocks of CDF_BLOCK entries that hold one first (a nonzero over [n, V] bools took 4 ms at [27, 152k]), then the
    entries of those blocks."""
    at_edge = depth == edge  # [n, V]
    b_rows, b_idx = _per_block(at_edge, lambda b: b.any(-1)).nonzero(as_tuple=True)  # [m] the blocks that hold one
    cols, past = _block_columns(b_idx, depth.shape[1])  # [m, B]
    which = (at_edge[b_rows[:, None], cols] & ~past).nonzero(as_tuple=True)
    return b_rows[which[0]], cols[which]


def seen_tokens(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, G: int, V: int) -> torch.Tensor:
    """[B x G, V] bool: the tokens of each prompt [B, P] (not its padding), a row for each of its G completions;
    the decode marks each sampled token in its row (the repetition penalty's tokens so far)."""
    seen = torch.zeros(prompt_ids.shape[0], V, dtype=torch.uint8, device=prompt_ids.device)
    seen.scatter_reduce_(1, prompt_ids, prompt_mask.to(torch.uint8), reduce="amax")  # a pad id that is also a real token: 1
    return seen.bool().repeat_interleave(G, 0)


def penalize_repetition(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers' RepetitionPenaltyLogitsProcessor (and vLLM's): the logits [n, V] of the tokens seen [n, V] divided by
    the penalty where positive, multiplied where negative; the rest as they were."""
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


def sample_tokens(
    logits: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    entropy: bool = True,
    overwrite: bool = False,
):
    """One token per row by inverse-CDF sampling: the first token whose cumulative probability
    exceeds u * total, u ~ U[0, 1) given per row. Exact in distribution to fp32 rounding (each token's
    weight exp(x - max) in fp32, running totals in float64: inverse_cdf), a token of probability 0 never
    chosen, and one random number per row instead of one per row and vocabulary entry (the exponential
    race drew 49152 per row on SmolLM2: a fifth of its decode). Returns (token [n], its log-prob [n],
    entropy [n] or None where not asked for): the entropy of the whole distribution at this temperature (before
    top-k/top-p/min-p), by the training forward's formula (algo.token_logprobs: log Z - sum(e s) / Z, e = exp(s), s = x - max x).
    Z (of the log-prob, and of the entropy without top-k/top-p) is the total the draw measured u against: float64
    sums of fp32 sums of CDF_BLOCK weights, rounded to fp32.
    One exp over [n, V] where log_softmax, exp and a float64 cumsum of every entry made three passes and a
    float64 copy: [64, 32000] 2.2 ms against 7.5, [64, 151936] 12 against 106 (bench/results/sampling_vocab_amd.md).
    overwrite: the logits are the caller's own, not read again (a decode step's): they are scaled and shifted in place
    instead of into a new [n, V] tensor (the same bits).
    Unfiltered rows of a vocabulary past DIRECT_CDF_MAX on the CPU: the same draw as one C pass per row where it builds
    (rollout.engines.native_sampler: two passes over a row instead of six), fp32 or bf16 logits; elsewhere bf16 logits
    are drawn from their fp32 copy (the values exactly)."""
    if native_sampler.applies(logits, top_k, top_p, min_p):
        return native_sampler.sample_rows(logits, uniforms, temperature, entropy)
    if logits.dtype in (torch.bfloat16, torch.float16):  # a decode step's bf16 logits: the ops below in fp32
        logits, overwrite = logits.float(), True
    rows = max(1, SAMPLE_CHUNK // logits.shape[-1])
    if logits.shape[0] > rows:  # in row chunks: each chunk's [rows, V] temporaries come from the heap again and again
        chunks = zip(logits.split(rows), uniforms.split(rows))
        parts = [_sample_rows(x, u, temperature, (top_k, top_p, min_p), entropy, overwrite) for x, u in chunks]
        return tuple(None if t[0] is None else torch.cat(t) for t in zip(*parts))
    return _sample_rows(logits, uniforms, temperature, (top_k, top_p, min_p), entropy, overwrite)


IN_PLACE = True  # False: the logits left whole even where the caller allows overwriting, and the shifted logits clamped
# as a copy (bench/sampler_in_place_ab.py's "before")
Z_FROM_DRAW = True  # False: Z as a sum of its own over [n, V] (bench/sampler_total_ab.py's "before")
SAMPLE_CHUNK = 1 << 22  # logits per chunk of sample_tokens (16 MB in fp32): glibc maps a fresh, page-faulting block for
# every allocation past 32 MB, where a [64, 151936] fp32 temporary is 39 MB


def _sample_rows(
    logits: torch.Tensor, uniforms: torch.Tensor, temperature: float, filters: tuple[int, float, float], with_entropy: bool, overwrite: bool
):
    """sample_tokens for one chunk of rows; filters: (top_k, top_p, min_p)."""
    top_k, top_p, min_p = filters
    overwrite = overwrite and IN_PLACE
    # at temperature 1, s = logits - max without a copy of the logits first (a pass over [n, V] saved)
    scaled = logits if temperature == 1.0 else logits.div_(temperature) if overwrite else logits / temperature  # [n, V]
    drop = outside_top_k(scaled, top_k)  # [n, V] or None, on the logits before they are shifted (their own ties)
    s, e = _shifted_exp(scaled, in_place=overwrite or scaled is not logits)  # [n, V], [n, V]
    # the whole distribution's Z and sum(e s) for the entropy, before a filter masks e in place
    whole = _entropy_terms(e, s) if with_entropy and (drop is not None or top_p < 1.0 or min_p > 0) else None
    # the distribution the token is drawn from: the kept tokens' weights are e's own (the row's most probable token is
    # kept, so the kept logits' max is the row's), the bits a second exp of the filtered logits gave
    kept_e = e if drop is None else e.masked_fill_(drop, 0.0)
    if top_p < 1.0:  # the nucleus of what top-k keeps, from the same weights
        kept_e = kept_e.masked_fill_(nucleus_outside(s, kept_e, top_p), 0.0)
    # min-p after top-k and top-p, as transformers' warpers run: p_j < min_p x p_max, i.e. e_j < min_p (the most
    # probable token's weight is exp(0) = 1, and it is kept)
    if min_p > 0:
        kept_e = kept_e.masked_fill_(kept_e < min_p, 0.0)
    token, kept_total = inverse_cdf(kept_e, uniforms, with_total=True)  # [n], [n] float64
    # [n, 1] Z: the draw's own running total, rounded to fp32 (no pass over [n, V] for it)
    kept_z = kept_total.float()[:, None] if Z_FROM_DRAW else kept_e.sum(-1, keepdim=True)
    logp = (s.gather(-1, token[:, None]) - kept_z.log()).squeeze(-1)
    if not with_entropy:
        return token, logp, None
    z, es = whole if whole is not None else (kept_z, torch.nansum(e.mul_(s), -1, keepdim=True))  # nansum: 0 x -inf
    return token, logp, (z.log() - es / z).squeeze(-1)


def _entropy_terms(e: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Z, sum(e s)) [n, 1] each without writing over e: one product-sum pass (vecdot) where s is finite (clamped at
    exp_flushed's cut in place), else e s as a new tensor and a nansum (0 x -inf at -inf logits)."""
    es = torch.linalg.vecdot(e, s).unsqueeze(-1) if IN_PLACE else torch.nansum(e * s, -1, keepdim=True)
    return e.sum(-1, keepdim=True), es


def _shifted_exp(x: torch.Tensor, *, in_place: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(s = x - max x, in place of x where in_place, e = exp(s)) over the last dim: x [n, V] -> [n, V], [n, V]."""
    m = x.amax(-1, keepdim=True)
    s = x.sub_(m) if in_place else x - m
    # a row spanning more than 87 nats: torch.exp's slow path on the CPU (algo.exp_flushed); s is ours (x's own or new),
    # and its entries clamped at the cut are read only where their weight is 0 (the entropy's e s: 0 either way)
    e = exp_flushed(s, clamp_in_place=IN_PLACE)
    return s, e


CDF_BLOCK = 64  # vocabulary entries per block: of inverse_cdf's running total, and where the heaviest tokens and the
# nucleus's edge are looked for
DIRECT_CDF_MAX = 1024  # vocabularies up to this size: one float64 cumsum over all of it


def _per_block(x: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """reduce(blocks, over their last dim) of each row's blocks of CDF_BLOCK entries, the last one shorter where V
    is not a multiple of it: x [n, V] -> [n, ceil(V / CDF_BLOCK)]."""
    n, V = x.shape
    full = V // CDF_BLOCK
    out = reduce(x[:, : full * CDF_BLOCK].view(n, full, CDF_BLOCK))  # [n, full]
    return out if V == full * CDF_BLOCK else torch.cat([out, reduce(x[:, full * CDF_BLOCK :].unsqueeze(1))], 1)


def _block_columns(blocks: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The vocabulary columns of blocks [...] (block indices), [..., CDF_BLOCK], clamped to V - 1 (a gather's
    index), and which of them lie past V (the last block's tail)."""
    cols = blocks[..., None] * CDF_BLOCK + torch.arange(CDF_BLOCK, device=blocks.device)
    return cols.clamp_max(V - 1), cols >= V


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
    V = weights.shape[1]
    target = uniforms.double()  # [n] times the total below: u < 1, so below the total (u x total rounds down from it)
    if V <= DIRECT_CDF_MAX:
        cdf = weights.double().cumsum(-1)  # [n, V]
        index = _first_above(cdf, target * cdf[:, -1])  # cdf[i] > target >= cdf[i - 1]: weight i is not 0
        return (index, cdf[:, -1]) if with_total else index
    cum = _per_block(weights, lambda b: b.sum(-1)).double().cumsum(-1)  # [n, blocks]
    target = target * cum[:, -1]
    block = _first_above(cum, target)  # [n] a block of nonzero sum, as above
    before = cum.gather(-1, (block - 1).clamp_min(0)[:, None]).squeeze(-1).masked_fill_(block == 0, 0.0)  # total of the blocks before
    cols, past = _block_columns(block, V)  # [n, CDF_BLOCK]
    w = weights.gather(-1, cols).masked_fill_(past, 0.0)  # the block's weights, past V none
    i = _first_above(w.double().cumsum(-1), target - before)
    # the block's float64 total can round below its fp32 sum: a target past it takes the block's last nonzero weight
    last = CDF_BLOCK - 1 - (w > 0).flip(-1).int().argmax(-1)  # [n]
    index = block * CDF_BLOCK + torch.minimum(i, last)
    return (index, cum[:, -1]) if with_total else index


def _first_above(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The first index i with cdf[i] > target: cdf [n, K] running totals, target [n] -> [n]."""
    return torch.searchsorted(cdf, target[:, None], right=True).squeeze(-1)
