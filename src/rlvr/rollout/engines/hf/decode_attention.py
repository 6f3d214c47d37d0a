"""The lean decode step's attention on the CPU: write the new token's keys/values, then attend, as one function.

One query per row (GQA: `rep` queries per kv head) against the row's keys/values: a write into the buffers, two
batched products of [rep, D] x [D, S] and a softmax between them. The eager step calls it as it is; the compiled
step (compiled_decode.py) traces it into its layer, where inductor fuses the write, the products of one query
row (reductions, not GEMMs) and the softmax into one loop over each row's keys and values. The write and the
reads take the slot as an argument (select/narrow, not indexing) so that a compiled graph keeps it symbolic.
tests/rollout/test_lean_decode.py checks both layouts against the model's own forward.

On the CPU the eager step reads the buffers whole (`whole`): it grows them a few slots at a time and masks the
slots not yet written, because the batched products over a slice of each row's buffer (slots 0..t of S) ran at half
the rate of the same products over buffers of just those slots (AMD EPYC, fp32, config B's shapes).

The shared layout can run both parts through SDPA's flash kernel instead (`flash`), as the decode did before the
explicit products: on an AMD EPYC the products took 0.4-0.9x the kernel's time (bench/results/attention_cpu.md),
on an Intel Xeon in fp32 the kernel decoded a 9M model's long prompts 9-17 % faster
(bench/results/decode_attention_intel.md). So can the repeated layout (`flash`, timed likewise): on that Xeon it
took 0.79-0.89x the products' time for 2 query heads per kv head of 64, 0.91-1.24x for one query per kv head, and a 3M
grouped-query model's long decode generated 2-3 % faster (bench/results/decode_attention_repeated_flash_intel.md).
Under bf16 autocast the buffers can be kept in bf16 (the products then run
in bf16, as autocast runs the training forward's; the scores, softmax and merge stay in fp32): half the bytes to read,
where the attention reads its keys and values from memory, but a rounding of keys and scores. On an AMD EPYC whole
generations took 0.84-0.88x the time on config C's shapes (25M, 8 heads of 64, ~270-token prompts), 0.91-0.95x on B's
(short prompts), level on F's (2 kv heads of 40), bench/results/decode_kv_dtype_amd.md. So the eager step asks
`decode_attention_way` once per decode: the ways timed on this machine at the decode's shapes the first time (bf16
only where it takes at most LOWER_AT_MOST of the best fp32 way's time), the answer kept in decode_attention.json beside
the precision cache (rlvr.models.machine_cache), so later runs there choose the same. For prompts of medium length
(rollout.engines.hf.steps.SHARED_PREFIX_TIMED_MAX) the same timing also picks the layout: a row reading its own copy
of a short prompt in one part can beat the group's shared copy read in a second part and merged
(bench/results/decode_layout_amd.md).

Where it builds (a C compiler, Linux, torch's libgomp: rlvr.models.native_build), the same timing also runs the rows' own
slots through a C kernel (`native`, native_attention.py): one pass over slots 0..t of each row's keys and values, fp32
or bf16 widened to fp32, the slots not yet written not read at all. The batched products read bf16 buffers slower than
fp32 ones; the kernel reads them at close to the memory's rate, so bf16 buffers pay where the products' did not. The
shared layout's prompt part (a group's many queries: products) stays as `flash` says, or, timed beside it where it
builds with AVX2 or AVX-512, runs through a second C kernel with the merge (`native_prefix`, native_prefix.py: the
prompt's keys kept transposed; SDPA's flash kernel ran that part at a quarter of the fp32 rate, and its regrouping and
merge took five more ops). Both kernels round only keys and values in bf16 (their scores and sums fp32): with bf16
buffers their log-probs lie as near a forward's as the fp32 products' (1.01-1.02x, bench/results/decode_kv_closeness_prefix.md),
so that way too is chosen wherever it is faster (LOWER_NATIVE_AT_MOST).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from rlvr.models.machine_cache import fastest_times, measured_once, power_of_two_at_least
from rlvr.models.norm_rotary import rotate
from rlvr.rollout.engines.hf import native_rotary
from rlvr.rollout.engines.hf.native_attention import available as native_available
from rlvr.rollout.engines.hf.native_attention import native_attention
from rlvr.rollout.engines.hf.native_prefix import available as prefix_available
from rlvr.rollout.engines.hf.native_prefix import prefix_merged as native_prefix_merged
from rlvr.rollout.engines.hf.native_prefix import transposed_keys

FLASH_AT_MOST = 0.97  # the kernel runs when it takes at most this share of the explicit products' time
# bf16 buffers (under bf16 autocast) when their attention takes at most this share of the fp32 buffers' time: they round
# the keys and the scores to bf16 (as the training forward's autocast does), so they must gain clearly
LOWER_AT_MOST = 0.9
# the repeated layout's bf16 buffers through the C kernel, which rounds only the keys and values (its scores and sums
# stay fp32): its log-probs lay as near a forward's as the fp32 buffers' (mean distance 0.99-1.04x theirs, against
# 1.10-1.26x for the products in bf16: bench/results/decode_kv_closeness.md), so it runs wherever it is faster. The
# shared layout's prompt part still runs the products in bf16 (1.13-1.19x): LOWER_AT_MOST there.
LOWER_NATIVE_AT_MOST = 1.0
SOFTMAX_MIN_KEYS = 16  # _softmax pads its scores to at least this many keys on the CPU
TIMED_BYTES = 2**26  # the most the timing's copies of the buffers take (decode_attention_way)
_CHOICES: dict[tuple, "AttentionWay"] = {}  # this process's answers of decode_attention_way


def decode_attention(
    q: torch.Tensor,  # [n, Hq, D] the new token's queries (rotated, or not yet where `rotary` is given)
    k: torch.Tensor,  # [n, Hkv, D] its keys (as q), written at slot t
    v: torch.Tensor,  # [n, Hkv, D]
    own_k: torch.Tensor,  # [n, Hkv, S, D] the rows' buffers (repeated layout: prompt in the first slots)
    own_v: torch.Tensor,  # [n, Hkv, S, D]
    t: int,  # the slot this token goes to; slots 0..t are read
    bias: torch.Tensor,  # repeated: [n, 1, 1, S]; shared: [B, 1, 1, P] over the prefix; 0 or -inf
    scale: float,
    prefix_k: torch.Tensor | None = None,  # shared layout: [B, Hkv, P, D], each prompt once
    prefix_v: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,  # shared layout: [n] which of the B x G rows these are
    group_size: int = 1,
    own_bias: torch.Tensor | None = None,  # whole buffers, shared layout: [1, 1, 1, S] 0 over slots 0..t, -inf after
    whole: bool = False,  # the buffers are read whole, their slots after t masked (by bias, or own_bias when shared)
    *,
    flash: bool = False,  # through SDPA's flash kernel (both parts in the shared layout; module docstring)
    native: bool = False,  # the row's own slots through the C kernel (native_attention.py); the shared prompt as `flash` says
    native_prefix: bool = False,  # with `native`: the shared prompt through native_prefix.py's kernel too, prefix_k its
    # transposed_keys
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,  # (cos, sin_signed) [n, 1, D]: q and k rotated here (with
    # the write, in one C pass where it builds: native_rotary.py)
) -> torch.Tensor:
    """softmax(q K^T x scale + bias) V over (the prompt) + (the row's tokens 0..t), [n, Hq x D], in the buffers' dtype
    (repeated layout) or q's (shared: the merge; native: fp32). Buffers in a lower precision than q (bf16 under bf16 autocast): the
    products in theirs, the scores and softmax in q's (fp32).
    Shared layout: the prompt part once per group (its G queries together) and the own part per row, merged exactly
    by their log-sum-exps. Whole buffers (lean_decode.DecodeState.slots): read whole, a masked slot's weight is 0."""
    n, Hkv, D = q.shape[0], own_k.shape[1], own_k.shape[-1]
    q = _rotated_and_written(q, k, v, own_k, own_v, t, rotary)
    if native:  # slots 0..t only, whole buffers or not; fp32 out (the next product casts it as it casts fp32)
        qn = q.to(torch.float32).view(n, Hkv, -1, D)
        if prefix_k is None:
            return native_attention(qn, own_k, own_v, scale, bias, t + 1)[0].view(n, -1)
        o_own, lse_own = native_attention(qn, own_k, own_v, scale, None, t + 1)
        if native_prefix:  # the prompt part and the merge in one more C call
            assert prefix_v is not None and rows is not None, "the shared layout passes prefix_v and rows with prefix_k"
            return native_prefix_merged(qn, prefix_k, prefix_v, bias, rows, group_size, scale, o_own, lse_own).view(n, -1)
        return _merged_with_prefix(qn, o_own, lse_own, prefix_k, prefix_v, bias, rows, group_size, scale, flash)
    keys, values = (own_k, own_v) if whole else (own_k.narrow(2, 0, t + 1), own_v.narrow(2, 0, t + 1))
    qr = q.to(torch.promote_types(q.dtype, own_k.dtype)).view(n, Hkv, -1, D)  # grouped-query: q heads j*rep..(j+1)*rep-1 read kv head j
    rep = qr.shape[2]
    if prefix_k is None:  # repeated layout: prompt and own tokens in one buffer
        out, _ = (_flash if flash else attend)(qr, keys, values, scale, bias if whole else bias.narrow(-1, 0, t + 1))
        return out.reshape(n, Hkv * rep * D)
    assert prefix_v is not None and rows is not None, "the shared layout passes prefix_v and rows with prefix_k"
    own = _flash if flash else attend_with_lse
    o_own, lse_own = own(qr, keys, values, scale, own_bias)  # lse [n, Hkv, rep]
    return _merged_with_prefix(qr, o_own, lse_own, prefix_k, prefix_v, bias, rows, group_size, scale, flash)


def _rotated_and_written(q, k, v, own_k, own_v, t: int, rotary: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """k and v written at slot t of the buffers, q and k rotated first where `rotary` is given (through one C pass
    where it builds and takes these dtypes, whichever way the attention runs: the pass gives the torch ops' bits, in ten
    ops' time less a layer): q as the attention reads it."""
    if rotary is not None and _rotary_pass_fits(q, k, v, own_k, own_v, *rotary):
        return native_rotary.rotate_and_write(q, k, v, *rotary, own_k, own_v, t)  # fp32, as rotate's with fp32 cos and sin
    if rotary is not None:
        q, k = rotate(q, *rotary), rotate(k, *rotary)
    own_k.select(2, t).copy_(k)
    own_v.select(2, t).copy_(v)
    return q


def _rotary_pass_fits(q, k, v, own_k, own_v, cos, sin_signed) -> bool:
    """Whether native_rotary's pass takes these: fp32 cos and sin (a model run in bf16 rotates by bf16 ones, in bf16),
    CPU tensors of its dtypes, and the kernel built."""
    return cos.dtype == sin_signed.dtype == torch.float32 and native_rotary.fits(q, k, v, own_k, own_v) and native_rotary.available()


def _merged_with_prefix(qr, o_own, lse_own, prefix_k, prefix_v, bias, rows, G: int, scale: float, flash: bool) -> torch.Tensor:
    """The shared layout: the prompt part of the attention (a group's queries together, through the flash kernel or
    the explicit products) merged with the rows' own part (o_own [n, Hkv, rep, D], lse_own [n, Hkv, rep]), [n, Hq x D]."""
    n, Hkv, rep, D = qr.shape
    B = prefix_k.shape[0]
    # every row still decoding: rows is 0..n-1 (compaction keeps their order), so the rows are their groups' places as
    # they are; eager only, where it saves four ops a layer; the compiled step keeps one graph whether rows have left or not
    every_row = n == B * G and not torch.compiler.is_compiling()
    # else the rows still decoding into their group's places, the finished ones' zero
    qf = qr if every_row else qr.new_zeros(B * G, Hkv, rep, D).index_copy_(0, rows, qr)
    qf = qf.view(B, G, Hkv, rep, D).transpose(1, 2).reshape(B, Hkv, G * rep, D)  # a group's queries together
    o_p, lse_p = (_flash if flash else attend_with_lse)(qf, prefix_k, prefix_v, scale, bias)  # lse [B, Hkv, G x rep]
    o_p = o_p.view(B, Hkv, G, rep, D).transpose(1, 2).reshape(B * G, Hkv, rep, D)
    lse_p = lse_p.view(B, Hkv, G, rep).transpose(1, 2).reshape(B * G, Hkv, rep)
    if not every_row:
        o_p, lse_p = o_p[rows], lse_p[rows]
    # exact merge of the two partial softmaxes: weights exp(lse_p) and exp(lse_own), normalised
    w = torch.sigmoid(lse_p - lse_own)[..., None]
    return torch.lerp(o_own.to(w.dtype), o_p.to(w.dtype), w).reshape(n, Hkv * rep * D)


def _weights(q, k, scale: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The scores q k^T x scale + bias [b, h, m, S] and their softmax, for q [b, h, m, D] and k [b, h, S, D]. Every
    query sees at least one key (its own token, or a prompt's last), so no row of scores is all -inf."""
    s = torch.matmul(q.to(k.dtype), k.transpose(-1, -2))  # [b, h, m, S]
    if s.dtype == q.dtype:
        s = s * scale
        if bias is not None:
            s = s + bias
    else:
        s = torch.add(bias, s, alpha=scale) if bias is not None else s.to(q.dtype).mul_(scale)
    # softmax normalises after exp(s - max), as the kernel does: exp(s - lse) would carry lse's rounding into every weight
    return s, _softmax(s)


def _softmax(s: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim; on the CPU over fewer than SOFTMAX_MIN_KEYS keys (a short prompt's part) padded to that
    many with -inf (weight 0): torch's CPU softmax over a last dim shorter than one vector of floats ran 4-25x the time
    of one over 16 (AMD EPYC, 2 threads: [8, 4, 192, 8] 445 -> 95 us, [8, 4, 8, 8] 22 -> 20 us;
    bench/results/episodes_chunks_amd.md). Not in a compiled graph: inductor writes its own softmax, and a branch on the
    number of keys would split the compiled step's graph in two."""
    S = s.shape[-1]
    if torch.compiler.is_compiling() or s.device.type != "cpu" or S >= SOFTMAX_MIN_KEYS:
        return torch.softmax(s, dim=-1)
    return torch.softmax(F.pad(s, (0, SOFTMAX_MIN_KEYS - S), value=float("-inf")), dim=-1)[..., :S]


def attend(q, k, v, scale: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T x scale + bias) v [b, h, m, D] and the scores [b, h, m, S], for v [b, h, S, D]. Two batched
    products: on the CPU mostly 0.4-0.9x the time of SDPA's flash kernel for the decode's few queries per kv head
    (bench/results/attention_cpu.md), the same math up to rounding."""
    s, p = _weights(q, k, scale, bias)
    return torch.matmul(p.to(v.dtype), v), s


def attend_with_lse(q, k, v, scale: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """attend's output and each query's log-sum-exp [b, h, m] (it merges two parts), read off the softmax instead of
    a logsumexp: the softmax's largest weight is exp(max - max) / sum = 1 / sum (its own rounding only), so
    lse = max + log(sum) = max - log(largest weight). Two max-reductions instead of logsumexp's second exp over every
    score: the prompt part of config F's decode attention (64 queries per kv head over ~300 keys) 0.7-0.85x the time
    (AMD EPYC, fp32)."""
    s, p = _weights(q, k, scale, bias)
    return torch.matmul(p.to(v.dtype), v), s.amax(-1) - p.amax(-1).log()


def _flash(q, k, v, scale: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA's CPU flash kernel: the output [b, h, m, D] and each query's log-sum-exp [b, h, m]."""
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias, scale=scale)
    return out[0], out[1]


class AttentionWay(NamedTuple):
    """How the eager CPU step's attention runs one decode (decode_attention_way)."""

    dtype: torch.dtype  # the KV buffers' dtype, in which the two products run (the scores and softmax in fp32 or wider)
    flash: bool  # the shared layout through SDPA's flash kernel (in the buffers' own dtype)
    shared: bool  # the prompt's keys/values once per group (else repeated into every row's buffer)
    native: bool = False  # the rows' own slots through the C kernel (native_attention.py; fp32 sums from either dtype)
    native_prefix: bool = False  # with native, shared: the prompt part through native_prefix.py's kernel, keys transposed


# the versions of the C kernels' timed ways, in the machine cache's key: 2, their AVX2 builds 1.7x (native_attention.c's
# own path) and 3.5x (native_prefix.c's sums in registers) faster than 1's at config B's and F's decode shapes
NATIVE_VERSION = 2
PREFIX_VERSION = 2


def decode_attention_way(
    groups: int, group_size: int, q_heads: int, kv_heads: int, head_dim: int, prompt: int, capacity: int, dtype: torch.dtype,
    *, shared: bool | None, lower: torch.dtype | None = None, layers: int = 1, repeated_flash: bool = True, native: bool = False,
) -> AttentionWay:  # fmt: skip
    """The fastest way on this machine at these shapes (prompt length and new-token capacity rounded up to a power of
    two, or to a multiple of 16 where both layouts are timed; `layers` of them read in turn), timed once, then read
    back: the layout `shared` asks for (None: whichever of the two is faster), buffers in `dtype` through the explicit
    products or the flash kernel (the repeated layout's only with `repeated_flash`: a caller that runs it), or buffers
    in `lower` (bf16 under bf16 autocast) through the explicit products where they take at most LOWER_AT_MOST of the
    best `dtype` way's time; with `native` (a caller that runs it: the eager step) the rows' own slots through the C
    kernel too, in either dtype, where it builds here and the buffers are fp32 (native_attention.py). Nothing to choose
    (repeated layout, no `lower`, no `repeated_flash`, no kernel): `dtype`, explicit."""
    native = native and dtype == torch.float32 and native_available()
    if shared is False and lower is None and not repeated_flash and not native:
        return AttentionWay(dtype, False, False)
    # the prompt's length to a multiple of 16 where both layouts are timed (the repeated layout's time grows with it, so
    # a power of two would favour the shared one up to twice the length), else to a power of two; the capacity to one
    P = -(-prompt // 16) * 16 if shared is None else power_of_two_at_least(prompt)
    T = power_of_two_at_least(capacity)
    shape: dict[str, int | str] = dict(groups=groups, group_size=group_size, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim)
    # explicit: the explicit products' version (3: whole buffers, the log-sum-exp read off the softmax; 4: the repeated
    # layout's flash kernel timed too); an answer timed against an earlier one is timed again
    name = lambda d: str(d).removeprefix("torch.") if d is not None else "none"  # noqa: E731
    layout = {True: "shared", False: "repeated", None: "either"}[shared]
    shape |= dict(layers=layers, prompt=P, capacity=T, dtype=name(dtype), lower=name(lower), layout=layout, explicit=4)
    # native, prefix: the C kernels' ways timed too (their versions: an answer timed against an earlier one is timed again)
    shape |= dict(repeated_flash=int(repeated_flash)) | (dict(native=NATIVE_VERSION) if native else {})
    prefix_kernel = native and shared is not False and prefix_available()
    shape |= dict(prefix=PREFIX_VERSION) if prefix_kernel else {}
    local = (*shape.values(), torch.get_num_threads())
    if local not in _CHOICES:
        layouts = (False, True) if shared is None else (shared,)
        timing = lambda: _time_ways(
            groups, group_size, q_heads, kv_heads, head_dim, P, T, dtype, layouts, lower, layers, repeated_flash, native, prefix_kernel
        )  # noqa: E731
        entry = measured_once("decode_attention", shape, timing)
        way_dtype = lower if entry.get("lower") and lower is not None else dtype
        native = bool(entry.get("native")) and native
        both = bool(entry.get("native_prefix")) and native and prefix_kernel
        chosen = (bool(entry.get("flash")), bool(entry.get("shared", shared)), native, both)
        _CHOICES[local] = AttentionWay(way_dtype, *chosen)
    return _CHOICES[local]


def _time_ways(
    B: int, G: int, Hq: int, Hkv: int, D: int, P: int, T: int, dtype, layouts: tuple[bool, ...], lower, layers: int,
    repeated_flash: bool, native: bool, prefix_kernel: bool = False,
) -> dict:  # fmt: skip
    """Seconds per call of decode_attention each way on random data of these shapes, from whole buffers of T // 2
    own slots (mid-decode) (machine_cache.fastest_times), and the choice: {"shared": .., "flash": .., "lower": ..,
    "native": .., "native_prefix": ..}.
    Each call reads the next of several copies of the buffers (as many as `layers`, up to TIMED_BYTES in all), so that,
    as in the decode, where the layers' caches outgrow the CPU's caches they are read from memory."""
    n, own = B * G, max(T // 2, 1)
    q, k, v = torch.randn(n, Hq, D, dtype=dtype), torch.randn(n, Hkv, D, dtype=dtype), torch.randn(n, Hkv, D, dtype=dtype)

    made: dict[tuple, list] = {}  # (layout, dtype, keys transposed): decode_attention's arguments for each copy

    def way(shared: bool, buffer_dtype, flash: bool, native: bool, native_prefix: bool):
        calls, turn = way_calls(shared, buffer_dtype, native_prefix), iter(range(2**62))
        return lambda: decode_attention(*calls[next(turn) % len(calls)], flash=flash, native=native, native_prefix=native_prefix)

    def way_calls(shared: bool, buffer_dtype, transposed: bool = False) -> list:
        if transposed and (shared, buffer_dtype, True) not in made:  # the same calls, each prompt's keys as native_prefix reads them
            made[shared, buffer_dtype, True] = [(*c[:8], transposed_keys(c[8]), *c[9:]) for c in way_calls(shared, buffer_dtype)]
        if (shared, buffer_dtype, transposed) not in made:
            slots = own if shared else P + own  # repeated: the prompt's slots first
            per_layer = 2 * (n * slots + (B * P if shared else 0)) * Hkv * D * dtype.itemsize
            copies = max(1, min(layers, TIMED_BYTES // per_layer))
            buffers = torch.randn(copies, 2, n, Hkv, slots, D, dtype=dtype).to(buffer_dtype)
            prefix: list = [(None, None)] * copies
            bias, own_bias = torch.zeros(n, 1, 1, slots, dtype=dtype), None
            if shared:
                prefix = list(torch.randn(copies, 2, B, Hkv, P, D, dtype=dtype).to(buffer_dtype))
                bias, own_bias = torch.zeros(B, 1, 1, P, dtype=dtype), torch.zeros(1, 1, 1, slots, dtype=dtype)
            rows = torch.arange(n)
            made[shared, buffer_dtype, False] = [
                (q, k, v, *buffers[i], slots - 1, bias, D**-0.5, *prefix[i], rows, G, own_bias, True) for i in range(copies)
            ]
        return made[shared, buffer_dtype, transposed]

    ways = _ways(dtype, layouts, lower, repeated_flash, native, prefix_kernel)
    with torch.no_grad(), torch.autocast("cpu", enabled=False):  # as the step calls it
        calls = [way(w.shared, w.dtype, w.flash, w.native, w.native_prefix) for w, _ in ways.values()]
        entry = dict(zip(ways, fastest_times(calls)))
    # the fp32 way of the least time over its share (a flash way's FLASH_AT_MOST), then the bf16 one of the least time over
    # its share (LOWER_AT_MOST, the kernel's LOWER_NATIVE_AT_MOST) if it takes at most that share of the fp32 way's time
    fastest = min((n for n, (w, _) in ways.items() if w.dtype == dtype), key=lambda n: entry[n] / ways[n][1])
    if lower is not None:  # the bf16 way that gains most by its share, if it takes at most that share of the fp32 one's time
        lowered = min((n for n, (w, _) in ways.items() if w.dtype != dtype), key=lambda n: entry[n] / ways[n][1])
        fastest = lowered if entry[lowered] <= ways[lowered][1] * entry[fastest] else fastest
    best = ways[fastest][0]
    choice = {"shared": best.shared, "flash": best.flash, "lower": best.dtype != dtype, "native": best.native}
    return entry | choice | {"native_prefix": best.native_prefix}


def _ways(
    dtype, layouts: tuple[bool, ...], lower, repeated_flash: bool, native: bool, prefix_kernel: bool = False
) -> dict[str, tuple[AttentionWay, float]]:
    """The ways _time_ways times, by name: (the way, the share of its time it is chosen at)."""
    ways: dict[str, tuple[AttentionWay, float]] = {}
    for shared in layouts:
        name = "shared" if shared else "repeated"
        ways[f"{name}_s"] = (AttentionWay(dtype, False, shared), 1.0)
        if shared or repeated_flash:  # the kernel where it takes at most FLASH_AT_MOST of the explicit products' time
            ways[f"{name}_flash_s"] = (AttentionWay(dtype, True, shared), FLASH_AT_MOST)
        if lower is not None:  # bf16 where it takes at most LOWER_AT_MOST of the best fp32 way's time
            ways[f"{name}_lower_s"] = (AttentionWay(lower, False, shared), LOWER_AT_MOST)
        if native:  # the C kernel for the own slots: the explicit products' math, read once; a shared prompt either way
            ways[f"{name}_native_s"] = (AttentionWay(dtype, False, shared, True), 1.0)
            if shared:
                ways[f"{name}_native_flash_s"] = (AttentionWay(dtype, True, shared, True), FLASH_AT_MOST)
            if lower is not None:  # (the flash kernel takes no bf16 buffers with fp32 queries)
                ways[f"{name}_lower_native_s"] = (
                    AttentionWay(lower, False, shared, True),
                    LOWER_AT_MOST if shared else LOWER_NATIVE_AT_MOST,
                )
        if native and shared and prefix_kernel:  # both parts through C kernels, which round only keys and values in bf16
            ways[f"{name}_native_prefix_s"] = (AttentionWay(dtype, False, shared, True, True), 1.0)
            if lower is not None:
                ways[f"{name}_lower_native_prefix_s"] = (AttentionWay(lower, False, shared, True, True), LOWER_NATIVE_AT_MOST)
    return ways
