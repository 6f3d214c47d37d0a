"""The softmax over a row split in two dense buffers (rlvr.models.native_softmax_pair): aten's add_ then softmax over
the concatenated row (and aten's softmax backward) in bf16 and fp32, to a few ulps of fp32 before the dtype's rounding
and as near the float64 truth; left padding weighs exactly 0 as a score plus the dtype's lowest does; every own-bias
broadcast; the same bits on any number of threads; and the grouped prefix attention through it as near its aten path."""

import pytest
import torch

from rlvr.models import native_build, native_softmax_pair, prefix_attention
from rlvr.models.prefix_attention import additive_bias, grouped_prefix_attention

DTYPES = [torch.float32, torch.bfloat16]


def _rows(U, Hkv, G, rep, P, C, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-2, 1.5, U * Hkv * G * rep * C)[:, None]  # rows from flat to very peaked
    a = (torch.randn(U * Hkv * G * rep * C, P, generator=g) * scale).to(dtype)
    b = (torch.randn(U * Hkv * G * rep * C, C, generator=g) * scale).to(dtype)
    return a, b


def _own_bias(kind, U, G, C, dtype, seed=1):
    """[U or 1, G or 1, C, C] as prefix_attention hands it: causal for all, per row (right padding), or additive floats."""
    causal = torch.ones(C, C, dtype=torch.bool).tril()
    if kind == "causal":
        return additive_bias(causal, dtype)[None, None]
    if kind == "per_row":
        lengths = torch.arange(U * G) % C + 1
        mask = causal[None] & (torch.arange(C)[None, None] < lengths[:, None, None])
        return additive_bias(mask, dtype).view(U, G, C, C)
    g = torch.Generator().manual_seed(seed)  # additive, one per group, broadcast over its rows
    return (torch.randn(U, 1, C, C, generator=g) * 3).to(dtype).masked_fill(~causal, torch.finfo(dtype).min)


def _aten(a, b, starts, own, U, Hkv, G, P, C):
    """aten's way: the prompt's mask and the own bias added to one buffer (add_ rounds to the dtype), then softmax."""
    s = torch.cat([a, b], -1).view(U, Hkv, G, -1, P + C)
    if starts is not None:
        mask = torch.arange(P)[None] >= starts[:, None]  # [U, P]
        s[..., :P] += additive_bias(mask, a.dtype)[:, None, None, None]
    R = s.shape[3]
    s[..., P:].view(U, Hkv, G, R // C, C, C).add_(own.view(own.shape[0], 1, own.shape[1], 1, C, C))
    return s, torch.softmax(s, -1)


TINY = 2.0**-100  # weights this far under the row's largest: the kernel's exp gives 0 below e x the smallest normal
# float (native_lanes.h), aten a subnormal or a value that lost its bits on the way there; no sum or product downstream
# tells them from 0. Above it the two agree to fp32's ulps.


def _ulps_of_fp32(got, want):
    """|got - want| in units of fp32's spacing at want, over the weights of at least TINY (the rest: at most TINY apart)."""
    diff, want = (got.double() - want.double()).abs(), want.double().abs()
    assert float(diff[want < TINY].sum()) <= TINY * max(int((want < TINY).sum()), 1)
    return float((diff[want >= TINY] / (want[want >= TINY] * 2.0**-23)).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "U,Hkv,G,rep,P,C,pads,own",
    [
        (2, 2, 3, 2, 37, 5, [0, 9], "causal"),
        (3, 1, 2, 4, 259, 48, [17, 0, 258], "per_row"),  # a group with one prompt key
        (1, 2, 4, 1, 16, 16, None, "additive"),  # no padding; rows of exactly one and two vectors
        (2, 1, 1, 3, 1, 1, [0, 1], "causal"),  # one prompt key, masked in group 1: the own key alone
        (1, 1, 2, 2, 1000, 33, [500], "per_row"),
    ],
)
def test_forward_and_backward_are_atens(dtype, U, Hkv, G, rep, P, C, pads, own):
    assert native_softmax_pair.vector_bits() >= 0, native_build.why_not(native_softmax_pair.SOURCE)  # CI has a compiler
    a, b = _rows(U, Hkv, G, rep, P, C, dtype)
    starts = None if pads is None else torch.tensor(pads)
    own_bias = _own_bias(own, U, G, C, dtype)
    scores, want = _aten(a, b, starts, own_bias, U, Hkv, G, P, C)
    native_softmax_pair.softmax_(a, b, starts, own_bias, U, Hkv, G)
    got = torch.cat([a, b], -1).view(want.shape)
    truth = torch.softmax(scores.double(), -1)  # from the same biased (and rounded) scores
    if starts is not None:
        masked = (torch.arange(P)[None] < starts[:, None])[:, None, None, None]  # [U, 1, 1, 1, P]
        assert bool((got[..., :P].masked_select(masked) == 0).all())  # exactly 0, as aten's exp of the lowest
    if dtype == torch.bfloat16:  # the fp32 weights differ by an ulp or two at most: the bf16 rounding rarely sees it
        assert _ulps_of_fp32(got, want) <= 2.0**16  # one bf16 ulp (2^-7 relative) at most
        normal = want.float().abs() >= TINY
        assert float((got.float() != want.float())[normal].float().mean()) < 1e-3  # an fp32 ulp rarely moves the rounding
    else:
        assert _ulps_of_fp32(got, want) <= 4
    # as near the truth as aten (its exp within 1 ulp of expf, the kernel's within 2)
    assert float((got.double() - truth).abs().max()) <= 2 * float((want.double() - truth).abs().max()) + TINY

    g = torch.Generator().manual_seed(5)
    d_p = torch.randn(want.shape, generator=g).to(dtype)
    d_want = torch.ops.aten._softmax_backward_data(d_p, want, -1, dtype)
    d_truth = torch.ops.aten._softmax_backward_data(d_p.double(), got.double(), -1, torch.float64)
    da, db = d_p.view(-1, P + C)[:, :P].contiguous(), d_p.view(-1, P + C)[:, P:].contiguous()
    native_softmax_pair.softmax_backward_(da, db, a, b)
    d_got = torch.cat([da, db], -1).view(want.shape)
    scale = float(d_truth.abs().max())
    assert float((d_got.double() - d_truth).abs().max()) <= 2 * float((d_want.double() - d_truth).abs().max()) + 1e-7 * scale


@pytest.mark.parametrize("dtype", DTYPES)
def test_threads_give_the_same_bits(dtype):
    U, Hkv, G, rep, P, C = 2, 2, 4, 2, 300, 24
    own, starts = _own_bias("per_row", U, G, C, dtype), torch.tensor([3, 40])
    outs = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            a, b = _rows(U, Hkv, G, rep, P, C, dtype)
            native_softmax_pair.softmax_(a, b, starts, own, U, Hkv, G)
            da, db = _rows(U, Hkv, G, rep, P, C, dtype, seed=7)
            native_softmax_pair.softmax_backward_(da, db, a, b)
            outs.append((a, b, da, db))
    finally:
        torch.set_num_threads(threads)
    for other in outs[1:]:
        assert all(torch.equal(x, y) for x, y in zip(outs[0], other))


def test_no_prompt_keys_or_no_own_keys():
    """A part of width 0: the softmax over the other alone (aten's over the one buffer)."""
    for P, C in ((0, 5), (6, 0)):
        a, b = _rows(2, 1, 1, 1, P, max(C, 1), torch.float32)
        b = b[:, :C].contiguous()
        want = torch.softmax(torch.cat([a, b], -1), -1)
        native_softmax_pair.softmax_(a, b, None, None, 1, 1, 1)
        torch.testing.assert_close(torch.cat([a, b], -1), want, rtol=4 * 2.0**-23, atol=TINY)


def test_bad_buffers_are_refused():
    a, b = _rows(1, 1, 1, 1, 8, 4, torch.float32)
    with pytest.raises(AssertionError, match="dense buffers of one dtype"):
        native_softmax_pair.softmax_(a, b.bfloat16(), None, None, 1, 1, 1)
    with pytest.raises(AssertionError, match="within the prompt"):
        native_softmax_pair.softmax_(a, b, torch.tensor([9]), None, 1, 1, 1)
    with pytest.raises(AssertionError, match="rows are"):
        native_softmax_pair.softmax_(a, b, None, None, 1, 1, 3)


def _attention_inputs(U, G, H, Hkv, P, C, D, seed):
    g = torch.Generator().manual_seed(seed)

    def leaf(*shape):
        return torch.randn(*shape, generator=g).requires_grad_()

    return leaf(U * G, H, C, D), leaf(U * G, Hkv, C, D), leaf(U * G, Hkv, C, D), leaf(U, Hkv, P, D), leaf(U, Hkv, P, D)


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("left_padding", [True, False])
def test_grouped_attention_through_the_kernel_as_through_aten(autocast, left_padding, monkeypatch):
    """The grouped prefix attention's output and gradients with the two dense buffers and the kernel, against its one
    buffer and aten's softmax: fp32 to fp32's rounding, bf16 autocast as near the float64 truth. A prompt mask that is
    not left padding (a hole) goes through the prompt bias added by torch, then the kernel."""
    U, G, H, Hkv, P, C, D = 2, 3, 4, 2, 40, 6, 16
    leaves = _attention_inputs(U, G, H, Hkv, P, C, D, seed=2)
    prompt_mask = torch.arange(P)[None] >= torch.tensor([0, 11])[:, None]
    if not left_padding:
        prompt_mask[0, 20:23] = False
    w = torch.randn(U * G, C, H, D, generator=torch.Generator().manual_seed(3))
    calls: list = []
    real = native_softmax_pair.softmax_
    monkeypatch.setattr(native_softmax_pair, "vector_bits", lambda: 256)  # an SSE build's kernel too (test_native_isa)
    monkeypatch.setattr(native_softmax_pair, "softmax_", lambda *a: calls.append(a[2]) or real(*a))

    def run(on: bool):
        monkeypatch.setattr(native_softmax_pair, "ON", on)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = grouped_prefix_attention(*leaves[:3], None, *leaves[3:], prompt_mask, 0.25)
        return (out, *torch.autograd.grad((out.float() * w).sum(), leaves))

    got, want = run(True), run(False)
    assert len(calls) == 1 and (calls[0] is not None) == left_padding  # the kernel once; the starts where they say it all
    truth_leaves = [t.detach().double().requires_grad_() for t in leaves]
    truth_out = grouped_prefix_attention(*truth_leaves[:3], None, *truth_leaves[3:], prompt_mask, 0.25)
    truth = (truth_out, *torch.autograd.grad((truth_out * w.double()).sum(), truth_leaves))
    for name, a, b, t in zip("out q k v prompt_k prompt_v".split(), got, want, truth):
        a, b, t = a.detach(), b.detach(), t.detach()
        scale = float(t.abs().max())
        if autocast:
            assert float((a.double() - t).abs().max()) <= 1.25 * float((b.double() - t).abs().max()) + 1e-3 * scale, name
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=2e-6 * scale, msg=name)


def test_scores_stay_in_one_buffer_where_the_kernel_does_not_apply(monkeypatch):
    """float64 (no kernel) and the switch off: one [.., P + C] buffer, the products over its slices."""
    q = torch.zeros(1, 1, 2, 6, 4, dtype=torch.float64)
    s = prefix_attention._scores(q, 1, 1, 2, 6, 5, 3, dense=native_softmax_pair.applies(q.dtype, q.device))
    assert s.whole is not None and s.whole.shape == (1, 1, 2, 6, 8) and s.prompt.stride(1) == 8
    monkeypatch.setattr(native_softmax_pair, "ON", False)
    assert not native_softmax_pair.applies(torch.bfloat16, q.device)
