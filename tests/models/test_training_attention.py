"""The training forward's explicit attention (rlvr.models.attention) against SDPA: the same outputs and gradients in
float64 (1e-10), at the op and through a real Llama's completion log-probs (plain and shared-prefix paths), close under
bf16 autocast; and used only where it is meant to be."""

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM
from _tiny_lms import grouped_batch

from rlvr.models import attention, native_causal_attention, prefix_attention
from rlvr.models.attention import explicit_attention, short_attention_explicit
from rlvr.models.forward import completion_logprobs
from rlvr.models.prefix_attention import grouped_prefix_attention


def _qkv(B=3, H=4, Hkv=2, Lq=6, Lk=6, D=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, L, D, generator=g, dtype=dtype, requires_grad=True) for h, L in ((H, Lq), (Hkv, Lk), (Hkv, Lk))]


def _sdpa(q, k, v, mask, scale):  # what transformers' SDPA function computes, [B, Lq, H, D]
    causal = mask is None and q.shape[2] > 1
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(1, 2)


def _padding_mask(B, Lq, Lk, pads):
    """Bool [B, 1, Lq, Lk]: causal aligned to the last key, keys before pads[b] masked (left padding)."""
    causal = torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq)
    keys = torch.arange(Lk)[None] >= torch.tensor(pads)[:, None]  # [B, Lk]
    return (causal[None] & keys[:, None, :])[:, None]


@pytest.mark.parametrize(
    "H,Hkv,Lq,Lk,pads",
    [(4, 4, 6, 6, None), (4, 2, 6, 6, None), (6, 2, 7, 7, [0, 2, 3]), (4, 1, 5, 9, [0, 4, 1]), (4, 2, 1, 9, [0, 4, 1])],
)
def test_explicit_attention_is_sdpa_in_float64(H, Hkv, Lq, Lk, pads):
    q, k, v = _qkv(H=H, Hkv=Hkv, Lq=Lq, Lk=Lk)
    mask = None if pads is None else _padding_mask(3, Lq, Lk, pads)
    real = torch.ones(3, Lq, dtype=torch.bool) if mask is None else mask[:, 0].any(-1)  # [B, Lq] queries with a key
    g = torch.randn(3, Lq, H, 8, dtype=torch.float64) * real[..., None, None]  # padding queries get no gradient
    outs, grads = [], []
    for f in (lambda: explicit_attention(q, k, v, mask, 0.3), lambda: _sdpa(q, k, v, mask, 0.3)):
        out = f()
        outs.append(out[real])
        grads.append(torch.autograd.grad(out, (q, k, v), g))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-10)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_additive_mask_and_fully_masked_rows_stay_finite():
    q, k, v = _qkv(Lq=5, Lk=5)
    mask = _padding_mask(3, 5, 5, [0, 3, 5])  # the last row masks every key of every query
    out = explicit_attention(q, k, v, mask, 0.5)
    out.sum().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(t.grad).all() for t in (q, k, v))
    additive = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(explicit_attention(q[:2], k[:2], v[:2], additive[:2], 0.5), out[:2], rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).train()


_batch = grouped_batch


MAX_ELEMENTS = attention.EXPLICIT_MAX["fp32"].elements


def _logp_and_grads(model, batch, shared: bool, explicit_max: int, monkeypatch, calls: list, grouped=None, max_elements=MAX_ELEMENTS):
    """explicit_max (positions per head, in fp32 and under bf16 autocast alike) 0: SDPA everywhere (the grouped products too)."""
    bounds = attention.Bounds(scores=explicit_max, elements=0 if explicit_max == 0 else max_elements)
    monkeypatch.setattr(attention, "EXPLICIT_MAX", {"fp32": bounds, "bf16": bounds})
    monkeypatch.setattr(attention, "explicit_attention", lambda *a: calls.append(a[0].shape) or explicit_attention(*a))
    grouped = calls if grouped is None else grouped
    monkeypatch.setattr(prefix_attention, "grouped_prefix_attention", lambda *a: grouped.append(a[0].shape) or grouped_prefix_attention(*a))
    p_ids, p_mask, c_ids, c_mask, groups = batch
    model.zero_grad()
    out = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, with_entropy=True, group_ids=groups if shared else None)
    (out.logp * c_mask).sum().backward()
    return (out.logp * c_mask).detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("shared", [False, True])
def test_a_llamas_logprobs_and_gradients_equal_sdpas_in_float64(llama, shared, monkeypatch):
    model = llama.double()
    try:
        explicit, grouped, sdpa = [], [], []
        logp_e, grad_e = _logp_and_grads(model, _batch(), shared, 10**6, monkeypatch, explicit, grouped)
        logp_s, grad_s = _logp_and_grads(model, _batch(), shared, 0, monkeypatch, sdpa)
    finally:
        llama.float()
    # each layer's attention took them: the prompts' and the completions' over their group's prompt (shared), the rows'
    assert len(explicit) == 2 and len(grouped) == 2 * shared and not sdpa
    torch.testing.assert_close(logp_e, logp_s, rtol=0, atol=1e-10)
    for name in grad_s:
        torch.testing.assert_close(grad_e[name], grad_s[name], rtol=0, atol=1e-10, msg=name)


def test_bf16_autocast_as_close_to_fp32_as_sdpa(llama, monkeypatch):
    """Under bf16 autocast neither path is exact; the explicit one (fp32 inside) is no further from the fp32 truth."""
    truth_logp, truth_grad = _logp_and_grads(llama, _batch(), False, 0, monkeypatch, [])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explicit, sdpa = [], []
        logp_e, grad_e = _logp_and_grads(llama, _batch(), False, 10**6, monkeypatch, explicit)
        logp_s, grad_s = _logp_and_grads(llama, _batch(), False, 0, monkeypatch, sdpa)
    assert len(explicit) == 2 and explicit[0][0] == 9 and not sdpa

    def err(a, b):  # max error relative to the largest value
        return float((a - b).abs().max() / b.abs().max().clamp(min=1e-6))

    assert err(logp_e, truth_logp) <= 1.5 * err(logp_s, truth_logp) + 1e-3
    for name in truth_grad:
        assert err(grad_e[name], truth_grad[name]) <= 1.5 * err(grad_s[name], truth_grad[name]) + 1e-3, name


def test_explicit_only_with_a_gradient_short_rows_and_sdpa_models(llama, monkeypatch):
    monkeypatch.setattr(native_causal_attention, "ON", False)  # in fp32 the C kernel comes first where it builds
    calls: list = []
    batch = _batch()
    monkeypatch.setattr(attention, "explicit_attention", lambda *a: calls.append(1) or explicit_attention(*a))
    with torch.no_grad():  # old log-probs, the reference: SDPA
        completion_logprobs(llama, *batch[:4])
    assert calls == []
    _logp_and_grads(llama, batch, False, 12 * 12, monkeypatch, calls)  # 13 x 13 positions per head: past the limit
    assert calls == []
    one_too_many = 9 * 4 * 13 * 13 - 1  # 9 rows x 4 heads: one score too many
    _logp_and_grads(llama, batch, False, 13 * 13, monkeypatch, calls, max_elements=one_too_many)
    assert calls == []
    _logp_and_grads(llama, batch, False, 13 * 13, monkeypatch, calls, max_elements=9 * 4 * 13 * 13)
    assert len(calls) == 2
    with short_attention_explicit(llama):
        assert llama.config._attn_implementation == attention.NAME
    assert llama.config._attn_implementation == "sdpa"
    llama.gradient_checkpointing_enable()
    try:
        with short_attention_explicit(llama):
            assert llama.config._attn_implementation == "sdpa"  # the recompute in the backward runs outside the block
    finally:
        llama.gradient_checkpointing_disable()
    llama.config._attn_implementation = "eager"
    try:
        with short_attention_explicit(llama):
            assert llama.config._attn_implementation == "eager"  # another attention than SDPA: left as it is
    finally:
        llama.config._attn_implementation = "sdpa"


def test_bf16_autocast_keeps_bf16_weights_and_takes_its_own_bounds():
    """Under bf16 autocast the weights autograd keeps for the backward are bf16 (2 bytes a score, where fp32 weights
    kept an fp32 copy and a bf16 one), the forward equals the fp32 softmax's weights rounded to bf16, and the shapes
    the explicit products take are EXPLICIT_MAX['bf16']'s; without autocast, fp32's."""
    B, H, Hkv, L, D = 2, 4, 2, 200, 8  # 200 x 200 positions per head: past fp32's bound, within bf16's
    assert attention.EXPLICIT_MAX["fp32"].scores < L * L <= attention.EXPLICIT_MAX["bf16"].scores
    q, k, v = _qkv(B=B, H=H, Hkv=Hkv, Lq=L, Lk=L, D=D, dtype=torch.float32)
    mask = _padding_mask(B, L, L, [0, 37])
    assert not attention._explicit_pays(q, L, Hkv, 0.0, {})
    kept: list[torch.Tensor] = []

    def pack(t):
        kept.append(t)
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attention._explicit_pays(q, L, Hkv, 0.0, {})
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = explicit_attention(q, k, v, mask, D**-0.5)
        # the same weights as the fp32 softmax of the same bf16 scores, rounded for the product with v
        s = torch.matmul((q * D**-0.5).reshape(B, Hkv, H // Hkv * L, D), k.transpose(-1, -2)).view(B, Hkv, H // Hkv, L, L)
        s = s + prefix_attention.additive_bias(mask, s.dtype)[:, :, None]
        want = torch.matmul(torch.softmax(s, -1, dtype=torch.float32).view(B, Hkv, -1, L), v).view(B, H, L, D).transpose(1, 2)
    scores = [t for t in kept if t.shape[-1] == L and t.numel() >= B * H * L * L]
    assert scores and all(t.dtype == torch.bfloat16 for t in scores), [(t.dtype, tuple(t.shape)) for t in scores]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in scores}  # softmax and product keep one
    assert list(storages.values()) == [B * H * L * L * 2]  # one bf16 copy of the weights
    torch.testing.assert_close(out.float(), want.float(), rtol=0, atol=1e-2)  # at most an ulp of bf16 on some weights
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


# --- SDPA over chunks of the queries (causal_sdpa) ------------------------------------------------------------------


@pytest.mark.parametrize("Lq,Lk", [(127, 127), (128, 128), (259, 259), (256, 268), (1024, 1024), (3000, 3100)])
def test_causal_chunks_cover_every_query_once_with_the_keys_it_sees(Lq, Lk):
    chunks = attention.causal_chunks(Lq, Lk)
    want = 1 if Lq < attention.CHUNK_MIN_QUERIES else min(attention.CHUNKS_MAX, round(Lq / attention.CHUNK_QUERIES))
    assert len(chunks) == want
    assert [c[0] for c in chunks] == [0] + [c[1] for c in chunks[:-1]] and chunks[-1][1] == Lq
    assert all(end == i1 + Lk - Lq and i1 > i0 for i0, i1, end in chunks)


@pytest.mark.parametrize("H,Hkv,Lq,Lk,pads", [(4, 2, 130, 130, None), (6, 2, 140, 151, [0, 9, 30]), (8, 2, 300, 300, [5, 0, 299])])
def test_chunked_sdpa_is_one_sdpa_call_in_float64(H, Hkv, Lq, Lk, pads):
    q, k, v = _qkv(H=H, Hkv=Hkv, Lq=Lq, Lk=Lk, D=8)
    mask = None if pads is None else _padding_mask(3, Lq, Lk, pads)
    real = torch.ones(3, Lq, dtype=torch.bool) if mask is None else mask[:, 0].any(-1)  # [B, Lq] queries with a key
    g = torch.randn(3, Lq, H, 8, dtype=torch.float64) * real[..., None, None]
    outs, grads = [], []
    for f in (lambda: attention.causal_sdpa(q, k, v, mask, 0.3, 0.0, {}), lambda: _sdpa(q, k, v, mask, 0.3)):
        out = f()
        outs.append(out[real])
        grads.append(torch.autograd.grad(out, (q, k, v), g))
    assert len(attention.causal_chunks(Lq, Lk)) > 1
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-10)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_causal_sdpa_only_where_it_is_the_same_math_and_pays():
    q, k, v = _qkv(H=4, Hkv=2, Lq=130, Lk=130, D=8)
    mask = _padding_mask(3, 130, 130, [0, 3, 7])
    assert attention.causal_sdpa(q, k, v, mask, 0.3, 0.0, {}) is not None
    assert attention.causal_sdpa(q, k, v, None, 0.3, 0.0, {}) is not None  # None over equal lengths: causal
    seen_later = mask.clone()
    seen_later[1, 0, 5, 100] = True  # query 5 of row 1 sees key 100: not causal
    mha_q, mha_k, mha_v = _qkv(H=2, Hkv=2, Lq=130, Lk=130, D=8)
    short = _qkv(H=4, Hkv=2, Lq=127, Lk=127, D=8)
    for args, kw in [
        ((q, k, v, seen_later, 0.3, 0.0, {}), {}),
        ((q, k, v, prefix_attention.additive_bias(mask, torch.float64), 0.3, 0.0, {}), {}),  # additive: left to SDPA
        ((q, k, v, mask, 0.3, 0.1, {}), {}),  # dropout
        ((q, k, v, mask, 0.3, 0.0, {"sliding_window": 64}), {}),
        ((mha_q, mha_k, mha_v, _padding_mask(3, 130, 130, [0, 3, 7]), 0.3, 0.0, {}), {}),  # a kv head per query head
        ((*short, _padding_mask(3, 127, 127, [0, 3, 7]), 0.3, 0.0, {}), {}),  # too few queries
        ((q.detach(), k.detach(), v.detach(), mask, 0.3, 0.0, {}), {}),  # no gradient
    ]:
        assert attention.causal_sdpa(*args, **kw) is None
    with torch.no_grad():
        assert attention.causal_sdpa(q, k, v, mask, 0.3, 0.0, {}) is None


@pytest.fixture(scope="module")
def long_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, pad_token_id=0, attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(cfg).train()


@pytest.mark.parametrize("shared", [False, True])
def test_a_llamas_long_rows_through_the_chunks_equal_one_call_in_float64(long_llama, shared, monkeypatch):
    model = long_llama.double()
    taken: list[bool] = []
    causal_sdpa = attention.causal_sdpa
    monkeypatch.setattr(attention, "causal_sdpa", lambda *a: taken.append((out := causal_sdpa(*a)) is not None) or out)
    results = []
    try:
        for chunked in (True, False):
            monkeypatch.setattr(attention, "CHUNKED", chunked)
            results.append(_logp_and_grads(model, _batch(C=150), shared, 0, monkeypatch, []))
    finally:
        long_llama.float()
    # both layers' completions (over the repeated prompt when shared; the 7-token prompts' pass too short) or whole
    # rows went through the chunks, with CHUNKED on only
    assert taken.count(True) == 2 and len(taken) == 4 * (1 + shared)
    (logp_c, grad_c), (logp_o, grad_o) = results
    assert bool((logp_c != 0).any())
    torch.testing.assert_close(logp_c, logp_o, rtol=0, atol=1e-10)
    for name in grad_o:
        torch.testing.assert_close(grad_c[name], grad_o[name], rtol=0, atol=1e-10, msg=name)


def test_the_chunks_under_bf16_autocast_as_close_to_fp32_as_one_call(long_llama, monkeypatch):
    monkeypatch.setattr(attention, "CHUNKED", False)
    truth_logp, truth_grad = _logp_and_grads(long_llama, _batch(C=150), False, 0, monkeypatch, [])
    got, taken = {}, []
    causal_sdpa = attention.causal_sdpa
    monkeypatch.setattr(attention, "causal_sdpa", lambda *a: taken.append((out := causal_sdpa(*a)) is not None) or out)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for chunked in (True, False):
            monkeypatch.setattr(attention, "CHUNKED", chunked)
            got[chunked] = _logp_and_grads(long_llama, _batch(C=150), False, 0, monkeypatch, [])
    assert taken == [True, True, False, False]  # both layers' rows through the chunks, then through one call

    def err(a, b):  # max error relative to the largest value
        return float((a - b).abs().max() / b.abs().max().clamp(min=1e-6))

    (logp_c, grad_c), (logp_o, grad_o) = got[True], got[False]
    assert err(logp_c, truth_logp) <= 1.5 * err(logp_o, truth_logp) + 1e-3
    for name in truth_grad:
        assert err(grad_c[name], truth_grad[name]) <= 1.5 * err(grad_o[name], truth_grad[name]) + 1e-3, name
