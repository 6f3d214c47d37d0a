"""The training forward's causal attention in C (rlvr.models.native_causal_attention): outputs and gradients against
the float64 truth (plain rows and over a shared prompt), the same bits at any thread count, the masks it takes and
the ones it leaves to the other ways, and a Llama's log-probs and gradients through it."""

from __future__ import annotations

import pytest
import torch
from _tiny_lms import grouped_batch, tiny_lm

from rlvr.models import attention, native_build, native_causal_attention as nca
from rlvr.models.forward import completion_logprobs


@pytest.fixture(autouse=True)
def any_vector_width(monkeypatch):
    """The kernel at any build's vector width (an SSE build's too: tests/models/test_native_isa.py)."""
    monkeypatch.setattr(nca, "MIN_VECTOR_BITS", 0)


def test_the_kernel_builds_here():
    assert nca.available(), native_build.why_not(nca.SOURCE)  # CI has a compiler


def _truth(q, k, v, mask, scale):
    """softmax(q k^T x scale + mask) v in float64, [B, Lq, H, D]; 0 for a query that sees no key."""
    R = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(R, 1), v.double().repeat_interleave(R, 1)
    s = (q.double() @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    return (torch.softmax(s, -1).nan_to_num(0.0) @ v).transpose(1, 2)


def _mask(B, Lq, Lk, start, stop):
    keys, queries = torch.arange(Lk), torch.arange(Lq)
    causal = keys[None, None] <= queries[None, :, None] + Lk - Lq
    return (causal & (keys >= start[:, None, None]) & (keys < stop[:, None, None]))[:, None]  # [B, 1, Lq, Lk]


def _inputs(B, H, Hkv, Lq, Lk, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Lq, H, D, generator=g).transpose(1, 2)  # transformers' layout: a transposed view
    k, v = torch.randn(B, Hkv, Lk, D, generator=g), torch.randn(B, Hkv, Lk, D, generator=g)
    return q, k, v, g


def _relative(a, b) -> float:
    """Largest difference over b's largest magnitude, or over 1 where b is smaller (inputs and output gradients are
    ~1: a query with one key has 0 as its gradient, and fp32 leaves ~1e-8 there)."""
    return float((a.detach().double() - b).abs().max() / max(float(b.abs().max()), 1.0))


def _check_against_truth(out, grads, truth_inputs, truth_out, d_out):
    truth_out.backward(d_out.double())
    assert _relative(out, truth_out.detach()) < 2e-6
    for got, t in zip(grads, truth_inputs):
        assert _relative(got, t.grad) < 4e-6


@pytest.mark.parametrize(
    "B, H, Hkv, Lq, Lk, D",
    [
        (3, 4, 2, 37, 41, 64),  # grouped heads, queries aligned to the last key
        (2, 4, 4, 70, 70, 32),  # a kv head per query head
        (2, 6, 2, 50, 50, 80),  # D not a multiple of the panel width
        (2, 12, 4, 9, 130, 40),  # few queries over many keys
        (1, 2, 1, 1, 1, 16),  # one key
        (2, 8, 1, 200, 203, 24),  # 8 query heads a kv head: query blocks of 64 rows, 8 queries each
    ],
)
def test_outputs_and_gradients_are_the_float64_truth(B, H, Hkv, Lq, Lk, D):
    q, k, v, g = _inputs(B, H, Hkv, Lq, Lk, D)
    start = torch.randint(0, Lk // 3 + 1, (B,), generator=g)  # left padding
    stop = torch.clamp(Lk - torch.randint(0, Lk // 4 + 1, (B,), generator=g), min=1)  # right padding
    mask = _mask(B, Lq, Lk, start, stop)
    keys = nca.key_range(mask, B, Lq, Lk)
    assert keys is not None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = nca.causal_attention(*leaves, keys, 0.7 * D**-0.5)
    d_out = torch.randn(out.shape, generator=g)
    out.backward(d_out)
    truth_inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    _check_against_truth(out, [t.grad for t in leaves], truth_inputs, _truth(*truth_inputs, mask, 0.7 * D**-0.5), d_out)


def test_a_query_that_sees_no_key_gets_zeros_and_passes_no_gradient():
    B, H, Hkv, L, D = 2, 4, 2, 12, 16
    q, k, v, g = _inputs(B, H, Hkv, L, L, D)
    start, stop = torch.tensor([5, 0]), torch.tensor([L, 0])  # row 0: 5 left-padded queries; row 1: nothing at all
    keys = nca.key_range(_mask(B, L, L, start, stop), B, L, L)
    assert keys is not None and keys.start.tolist() == [5, 0] and keys.stop.tolist() == [L, 0]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = nca.causal_attention(*leaves, keys, 0.25)
    out.backward(torch.randn(out.shape, generator=g))
    assert bool((out[0, :5] == 0).all()) and bool((out[1] == 0).all()) and bool((out[0, 5:] != 0).all())
    assert bool((leaves[0].grad[0, :, :5] == 0).all()) and bool((leaves[0].grad[1] == 0).all())
    assert bool((leaves[1].grad[0, :, :5] == 0).all()) and bool((leaves[2].grad[1] == 0).all())
    assert bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(t.grad).all()) for t in leaves)


@pytest.mark.parametrize("G, Hkv", [(3, 2), (1, 4)])
def test_over_a_shared_prompt_as_over_the_prompt_repeated_per_row(G, Hkv):
    U, H, P, C, D = 2, 4, 23, 17, 32
    B = U * G
    q, k, v, g = _inputs(B, H, Hkv, C, C, D, seed=1)
    pk, pv = torch.randn(U, Hkv, P, D, generator=g), torch.randn(U, Hkv, P, D, generator=g)
    prompt_mask = torch.arange(P)[None] >= torch.tensor([[4], [0]])  # [U, P]: group 0's prompt left-padded by 4
    own_stop = torch.randint(1, C + 1, (B,), generator=g)  # completions right-padded
    own_mask = _mask(B, C, C, torch.zeros(B, dtype=torch.long), own_stop)
    keys = nca.prefix_key_range(prompt_mask, own_mask, B, C)
    assert keys is not None and keys.start.tolist() == [4] * G + [0] * G and keys.stop.tolist() == (own_stop + P).tolist()
    leaves = [t.clone().requires_grad_() for t in (q, k, v, pk, pv)]
    out = nca.causal_attention(*leaves[:3], keys, D**-0.5, prefix=(leaves[3], leaves[4]))
    d_out = torch.randn(out.shape, generator=g)
    out.backward(d_out)
    # the truth: the prompt's keys repeated for each row of its group, in float64 (the gradients summed back by autograd)
    truth_inputs = [t.detach().double().requires_grad_() for t in (q, k, v, pk, pv)]
    tq, tk, tv, tpk, tpv = truth_inputs
    full_k = torch.cat([tpk.repeat_interleave(G, 0), tk], dim=2)
    full_v = torch.cat([tpv.repeat_interleave(G, 0), tv], dim=2)
    mask = torch.cat([prompt_mask.repeat_interleave(G, 0)[:, None, None, :].expand(B, 1, C, P), own_mask], dim=-1)
    _check_against_truth(out, [t.grad for t in leaves], truth_inputs, _truth(tq, full_k, full_v, mask, D**-0.5), d_out)


def test_the_same_bits_at_any_thread_count():
    B, H, Hkv, L, D = 5, 8, 2, 90, 40
    q, k, v, g = _inputs(B, H, Hkv, L, L, D)
    keys = nca.key_range(_mask(B, L, L, torch.tensor([0, 3, 9, 0, 1]), torch.full((B,), L)), B, L, L)
    d_out = torch.randn(B, L, H, D, generator=g)
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = nca.causal_attention(*leaves, keys, 0.3)
            out.backward(d_out)
            results.append([out.detach()] + [t.grad for t in leaves])
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


def test_key_range_only_for_causal_masks_within_one_range_per_row():
    B, L = 3, 10
    start, stop = torch.tensor([0, 2, 4]), torch.tensor([L, 8, L])
    mask = _mask(B, L, L, start, stop)
    keys = nca.key_range(mask, B, L, L)
    assert keys is not None and keys.start.tolist() == [0, 2, 4] and keys.stop.tolist() == [L, 8, L]
    shared = nca.key_range(_mask(1, L, L, torch.tensor([0]), torch.tensor([L])), B, L, L)  # one row for all
    assert shared is not None and shared.start.tolist() == [0] * B and shared.stop.tolist() == [L] * B
    causal = nca.key_range(None, B, L, L)  # None over equal lengths: causal
    assert causal is not None and causal.stop.tolist() == [L] * B
    assert nca.key_range(None, B, L - 1, L) is None  # None over unequal lengths: not a mask it knows
    hole = mask.clone()
    hole[1, 0, 6:, 4] = False  # a key in the middle of row 1 masked
    later = mask.clone()
    later[0, 0, 2, 5] = True  # query 2 sees key 5: not causal
    additive = torch.zeros(B, 1, L, L).masked_fill(~mask, float("-inf"))
    for bad in (hole, later, additive, mask[:, :, :-1]):
        assert nca.key_range(bad, B, bad.shape[2], L) is None
    prompt = torch.tensor([[True, False, True]])  # not left padding
    assert nca.prefix_key_range(prompt, None, 2, 4) is None
    late_start = _mask(2, 4, 4, torch.tensor([1, 0]), torch.tensor([4, 4]))  # completions that do not start at key 0
    assert nca.prefix_key_range(torch.ones(1, 3, dtype=torch.bool), late_start, 2, 4) is None


@pytest.mark.parametrize("shared", [False, True])
def test_a_llamas_logprobs_and_gradients_through_the_kernel_are_sdpas(shared, monkeypatch):
    """fp32: the kernel for every layer's attention with a gradient (the prompts' pass and the completions' over their
    group's prompt where shared), against SDPA (the other ways off)."""
    calls: list = []
    kernel = nca.causal_attention
    monkeypatch.setattr(nca, "causal_attention", lambda *a, **k: calls.append(a[0].shape) or kernel(*a, **k))
    llama = tiny_lm("llama", max_position_embeddings=128).train()  # 6 query heads over 2 kv heads
    p_ids, p_mask, c_ids, c_mask, groups = grouped_batch(P=9, C=14)
    results = []
    for on in (True, False):
        monkeypatch.setattr(nca, "ON", on)
        monkeypatch.setattr(attention, "EXPLICIT_MAX", {w: attention.Bounds(0, 0) for w in ("fp32", "bf16")})  # no explicit products
        monkeypatch.setattr(attention, "CHUNKED", False)
        llama.zero_grad()
        with attention.short_attention_explicit(llama):
            out = completion_logprobs(llama, p_ids, p_mask, c_ids, c_mask, group_ids=groups if shared else None)
        (out.logp * c_mask).sum().backward()
        results.append(((out.logp * c_mask).detach(), {n: p.grad.clone() for n, p in llama.named_parameters()}))
    assert len(calls) == 2 * (1 + shared)  # both layers; shared: the prompts' pass too
    (logp_n, grad_n), (logp_s, grad_s) = results
    torch.testing.assert_close(logp_n, logp_s, rtol=0, atol=2e-5)
    for name in grad_s:
        scale = float(grad_s[name].abs().max())
        torch.testing.assert_close(grad_n[name], grad_s[name], rtol=0, atol=2e-5 * max(scale, 1e-3), msg=name)


def test_a_retained_graph_runs_its_backward_again():
    q, k, v, g = _inputs(2, 4, 2, 20, 20, 16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = nca.causal_attention(*leaves, nca.key_range(None, 2, 20, 20), 0.25)
    d_out = torch.randn(out.shape, generator=g)
    out.backward(d_out, retain_graph=True)
    first = [t.grad.clone() for t in leaves]
    out.backward(d_out)
    for t, once in zip(leaves, first):
        assert torch.equal(t.grad, 2 * once)
