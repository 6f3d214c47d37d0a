"""Long causal self-attention in blocks of queries (rlvr.models.causal_attention): the same outputs and gradients as
explicit_attention and SDPA in float64 (1e-10) for any split into blocks, with grouped-query heads and left padding; the
training forward takes it only for causal rows with a gradient outside autocast, and a real Llama's log-probs and
gradients through it equal SDPA's."""

import pytest
import torch
from test_training_attention import _batch, _logp_and_grads, _padding_mask, _qkv, _sdpa, llama  # noqa: F401  (fixture)

from rlvr.models import attention, causal_attention
from rlvr.models.attention import explicit_attention
from rlvr.models.causal_attention import causal_blocked_attention, is_causal, query_blocks


@pytest.mark.parametrize("block_positions", [1, 3, 7, 100])  # blocks of 1, 3 (the last shorter), 7 positions; one block
@pytest.mark.parametrize(
    "H,Hkv,pads,kind", [(4, 4, None, None), (4, 2, [0, 2, 3], "bool"), (6, 2, [1, 0, 4], "additive"), (4, 1, None, "shared")]
)
def test_blocks_equal_explicit_attention_and_sdpa_in_float64(H, Hkv, pads, kind, block_positions, monkeypatch):
    L, D = 8, 8
    monkeypatch.setattr(causal_attention, "QUERY_ROWS", block_positions * (H // Hkv))
    assert len(query_blocks(L, H // Hkv)) == -(-L // block_positions)
    q, k, v = _qkv(H=H, Hkv=Hkv, Lq=L, Lk=L)
    mask = None if pads is None else _padding_mask(3, L, L, pads)
    if kind == "shared":
        mask = torch.ones(L, L, dtype=torch.bool).tril()[None, None]
    if kind == "additive":
        mask = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    visible = torch.ones(3, 1, L, L, dtype=torch.bool).tril() if mask is None else (mask if mask.dtype == torch.bool else mask == 0)
    real = visible.expand(3, 1, L, L)[:, 0].any(-1)  # [B, L] queries with a key: padding queries are no one's input
    g = torch.randn(3, L, H, D, dtype=torch.float64) * real[..., None, None]
    results = []
    for f in (causal_blocked_attention, explicit_attention, lambda *a: _sdpa(*a[:4], a[4])):
        out = f(q, k, v, mask, 0.3)
        results.append((out[real], torch.autograd.grad(out, (q, k, v), g)))
    for out, grads in results[1:]:
        torch.testing.assert_close(results[0][0], out, rtol=0, atol=1e-10)
        for a, b, name in zip(results[0][1], grads, "qkv"):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10, msg=name)


def test_is_causal():
    L = 5
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    assert is_causal(None, L) and is_causal(causal[None, None], L) and is_causal(_padding_mask(3, L, L, [0, 2, 5]), L)
    additive = torch.zeros(L, L).masked_fill(~causal, torch.finfo(torch.float32).min)
    assert is_causal(additive[None, None], L)
    peeking = causal.clone()
    peeking[1, 3] = True  # query 1 sees key 3
    assert not is_causal(peeking[None, None], L) and not is_causal(torch.zeros(1, 1, L, L), L)


def _counting(monkeypatch) -> list:
    calls: list = []
    blocked = causal_attention.causal_blocked_attention
    monkeypatch.setattr(causal_attention, "causal_blocked_attention", lambda *a: calls.append(a[0].shape) or blocked(*a))
    return calls


@pytest.mark.parametrize("shared", [False, True])
def test_a_llamas_logprobs_and_gradients_through_the_blocks_equal_sdpas_in_float64(llama, shared, monkeypatch):  # noqa: F811
    """Every self-attention past the per-head bound (here: all of them) takes the blocks: the rows' in the plain path,
    the prompts' in the shared-prefix path (the completions there attend over their group's prompt: grouped)."""
    model = llama.double()
    try:
        monkeypatch.setattr(causal_attention, "QUERY_ROWS", 1)  # a block per query position
        calls = _counting(monkeypatch)
        explicit, grouped, sdpa = [], [], []
        logp_b, grad_b = _logp_and_grads(model, _batch(), shared, 1, monkeypatch, explicit, grouped)
        assert len(calls) == 2 and not explicit and len(grouped) == 2 * shared
        logp_s, grad_s = _logp_and_grads(model, _batch(), shared, 0, monkeypatch, sdpa)
        assert len(calls) == 2 and not sdpa
    finally:
        llama.float()
    torch.testing.assert_close(logp_b, logp_s, rtol=0, atol=1e-10)
    for name in grad_s:
        torch.testing.assert_close(grad_b[name], grad_s[name], rtol=0, atol=1e-10, msg=name)


def test_the_blocks_only_for_causal_rows_with_a_gradient_outside_autocast(llama, monkeypatch):  # noqa: F811
    calls = _counting(monkeypatch)
    batch = _batch()
    monkeypatch.setattr(attention, "EXPLICIT_MAX_SCORES", 1)  # past the explicit products' bound per head
    with torch.no_grad():
        from rlvr.models.forward import completion_logprobs

        completion_logprobs(llama, *batch[:4])
    assert calls == []  # no gradient: SDPA
    _logp_and_grads(llama, batch, False, 1, monkeypatch, [])
    assert len(calls) == 2  # fp32 with a gradient: each layer's rows
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _logp_and_grads(llama, batch, False, 1, monkeypatch, [])
    assert len(calls) == 2  # under autocast: SDPA
    _logp_and_grads(llama, batch, False, 1, monkeypatch, [], max_elements=9 * 4 * 13 * 13 - 1)
    assert len(calls) == 2  # one score past the memory bound: SDPA
    q, k, v = _qkv(Lq=4, Lk=4, dtype=torch.float32)
    peeking = torch.ones(1, 1, 4, 4, dtype=torch.bool)  # not causal: every query sees every key
    out, _ = attention.training_attention(llama.model.layers[0].self_attn, q, k, v, peeking, scaling=0.5)
    assert len(calls) == 2
    torch.testing.assert_close(out, _sdpa(q, k, v, peeking, 0.5), rtol=1e-6, atol=1e-6)
