"""Completions' attention over their group's shared prompt (rlvr.models.prefix_attention): the grouped products equal
the plain attention over the prompt repeated for each row (outputs and every gradient, float64, 1e-10), and the
shared-prefix forward takes them only where every layer did, else the repeated prompt, with the same numbers (and the
plain path's, to fp32's rounding: transformers' RMSNorm)."""

import pytest
import torch

from rlvr.models import forward, prefix_attention
from rlvr.models.attention import explicit_attention
from rlvr.models.forward import completion_logprobs
from rlvr.models.prefix_attention import grouped_prefix_attention, repeated


def _inputs(U, G, H, Hkv, P, C, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)

    def leaf(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    return leaf(U * G, H, C, D), leaf(U * G, Hkv, C, D), leaf(U * G, Hkv, C, D), leaf(U, Hkv, P, D), leaf(U, Hkv, P, D)


def _own_mask(kind: str, N: int, C: int, lengths):
    """The completions' own mask as the model hands it: None (causal), bool or additive [N, 1, C, C] with right
    padding (keys past a row's length masked), or one causal mask for all rows [1, 1, C, C]."""
    causal = torch.ones(C, C, dtype=torch.bool).tril()
    if kind == "none":
        return None
    if kind == "shared":
        return causal[None, None]
    mask = (causal[None] & (torch.arange(C)[None, None] < torch.tensor(lengths)[:, None, None]))[:, None]
    return mask if kind == "bool" else torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))


@pytest.mark.parametrize(
    "U,G,H,Hkv,P,C,pads,own",
    [
        (2, 3, 4, 2, 5, 4, [0, 2], "bool"),
        (3, 2, 4, 4, 6, 3, [1, 0, 4], "none"),
        (1, 4, 6, 2, 7, 5, [0], "additive"),
        (2, 1, 4, 1, 4, 1, [3, 0], "bool"),  # one row per group, one completion token
        (2, 2, 2, 2, 3, 4, [0, 0], "shared"),  # no prompt padding: no prompt bias
    ],
)
def test_grouped_equals_attention_over_the_repeated_prompt(U, G, H, Hkv, P, C, pads, own):
    q, k, v, pk, pv = _inputs(U, G, H, Hkv, P, C)
    prompt_mask = torch.arange(P)[None] >= torch.tensor(pads)[:, None]  # [U, P] left padding
    mask = _own_mask(own, U * G, C, [1 + (i % C) for i in range(U * G)])
    out = grouped_prefix_attention(q, k, v, mask, pk, pv, prompt_mask, 0.3)
    want = explicit_attention(q, *repeated(k, v, mask, pk, pv, prompt_mask, G), 0.3)
    assert out.shape == (U * G, C, H, 8)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-10)
    w = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((out * w).sum(), (q, k, v, pk, pv))
    want_grads = torch.autograd.grad((want * w).sum(), (q, k, v, pk, pv))
    for name, a, b in zip("q k v prompt_k prompt_v".split(), grads, want_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10, msg=name)


def test_repeated_builds_the_plain_inputs():
    q, k, v, pk, pv = _inputs(2, 3, 4, 2, 5, 2)
    prompt_mask = torch.tensor([[False, True, True, True, True], [True] * 5])
    keys, values, mask = repeated(k, v, None, pk, pv, prompt_mask, 3)
    assert keys.shape == values.shape == (6, 2, 7, 8) and mask.shape == (6, 1, 2, 7) and mask.dtype == torch.bool
    assert torch.equal(keys[4, :, :5], pk[1]) and torch.equal(keys[4, :, 5:], k[4]) and torch.equal(values[2, :, :5], pv[0])
    assert mask[:3, 0, :, 0].logical_not().all() and mask[:3, 0, :, 1:5].all() and mask[3:, 0, :, :5].all()
    assert torch.equal(mask[0, 0, :, 5:], torch.ones(2, 2, dtype=torch.bool).tril())  # the completions' own: causal
    additive = torch.zeros(6, 1, 2, 2, dtype=torch.float64)
    assert repeated(k, v, additive, pk, pv, prompt_mask, 3)[2][0, 0, 0, 0] == torch.finfo(torch.float64).min


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).double().train()


def _batch(G=3):
    g = torch.Generator().manual_seed(2)
    P, C = 6, 5
    p_mask = (torch.arange(P)[None] >= torch.tensor([0, 2])[:, None]).long()  # two prompts, the second left-padded
    p_ids = torch.randint(1, 40, (2, P), generator=g) * p_mask
    c_mask = (torch.arange(C)[None] < torch.randint(1, C + 1, (2 * G,), generator=g)[:, None]).long()
    c_ids = torch.randint(1, 40, (2 * G, C), generator=g) * c_mask
    return p_ids.repeat_interleave(G, 0), p_mask.repeat_interleave(G, 0), c_ids, c_mask, torch.arange(2).repeat_interleave(G)


def _logp_grads(model, batch, shared: bool):
    p_ids, p_mask, c_ids, c_mask, groups = batch
    model.zero_grad()
    out = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, group_ids=groups if shared else None)
    (out.logp * c_mask).sum().backward()
    return (out.logp * c_mask).detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _same(a, b):
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-10)
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], rtol=0, atol=1e-10, msg=name)


def _over_the_repeated_prompt(llama, batch, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(forward, "_completions_over_grouped_prefix", lambda *a: None)
        return _logp_grads(llama, batch, shared=True)


def test_a_layer_that_does_not_take_its_prompt_sends_the_forward_to_the_repeated_prompt(llama, monkeypatch):
    """A model whose attention of some layer bypasses rlvr's function (simulated: layer 1 does not take its prompt)
    must not use the grouped pass's outputs: the forward runs again over the repeated prompt."""
    batch = _batch()
    plain = _over_the_repeated_prompt(llama, batch, monkeypatch)
    grouped_calls: list = []
    real_take, real_grouped = prefix_attention.take, prefix_attention.grouped_prefix_attention
    monkeypatch.setattr(prefix_attention, "grouped_prefix_attention", lambda *a: grouped_calls.append(1) or real_grouped(*a))
    _same(_logp_grads(llama, batch, shared=True), plain)
    assert len(grouped_calls) == 3  # every layer, grouped
    monkeypatch.setattr(prefix_attention, "take", lambda module: None if module.layer_idx == 1 else real_take(module))
    grouped_calls.clear()
    _same(_logp_grads(llama, batch, shared=True), plain)
    assert len(grouped_calls) == 2  # layers 0 and 2 took theirs in the grouped pass, whose logits were then dropped


def test_without_a_gradient_and_with_unequal_groups_the_repeated_prompt(llama, monkeypatch):
    grouped_calls: list = []
    real_grouped = prefix_attention.grouped_prefix_attention
    monkeypatch.setattr(prefix_attention, "grouped_prefix_attention", lambda *a: grouped_calls.append(1) or real_grouped(*a))
    p_ids, p_mask, c_ids, c_mask, groups = _batch()
    with torch.no_grad():  # old log-probs: the prompt repeated inside the attention function, SDPA
        plain = completion_logprobs(llama, p_ids, p_mask, c_ids, c_mask).logp
        shared = completion_logprobs(llama, p_ids, p_mask, c_ids, c_mask, group_ids=groups).logp
    torch.testing.assert_close(shared * c_mask, plain * c_mask, rtol=0, atol=1e-10)
    assert grouped_calls == []
    uneven = (p_ids[1:], p_mask[1:], c_ids[1:], c_mask[1:], groups[1:])  # groups of 2 and 3 rows: the repeated prompt
    _same(_logp_grads(llama, uneven, shared=True), _over_the_repeated_prompt(llama, uneven, monkeypatch))
    assert grouped_calls == []
    # against the plain path (every row's prompt its own): transformers' RMSNorm runs in fp32 also in an fp64 model
    # (and so does its gradient), so the two ways of summing a prompt's gradient agree to fp32's rounding only
    shared, plain = _logp_grads(llama, _batch(), shared=True), _logp_grads(llama, _batch(), shared=False)
    torch.testing.assert_close(shared[0], plain[0], rtol=0, atol=1e-10)
    for name in plain[1]:
        torch.testing.assert_close(shared[1][name], plain[1][name], rtol=1e-6, atol=1e-6 * float(plain[1][name].abs().max()), msg=name)


@pytest.mark.parametrize(
    "U,G,H,Hkv,P,C,pads,own",
    [(2, 4, 4, 2, 24, 7, [0, 5], "bool"), (3, 2, 2, 2, 17, 9, [3, 0, 1], "additive"), (2, 3, 6, 2, 30, 5, [0, 0], "none")],
)
def test_grouped_under_bf16_autocast_as_close_to_the_truth_as_the_repeated_prompt(U, G, H, Hkv, P, C, pads, own):
    """Under bf16 autocast the grouped products compute as explicit_attention does over the repeated prompt (products
    in bf16, softmax from bf16 scores to bf16 weights, output bf16): no further from the float64 truth, output and
    every gradient."""
    q, k, v, pk, pv = _inputs(U, G, H, Hkv, P, C, seed=3)
    prompt_mask = torch.arange(P)[None] >= torch.tensor(pads)[:, None]
    mask = _own_mask(own, U * G, C, [1 + (i % C) for i in range(U * G)])
    w = torch.randn(U * G, C, H, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    truth = explicit_attention(q, *repeated(k, v, mask, pk, pv, prompt_mask, G), 0.3)
    truth_grads = torch.autograd.grad((truth * w).sum(), (q, k, v, pk, pv))
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v, pk, pv)]  # fp32 model inputs, as autocast meets them
    fmask = mask.float() if mask is not None and mask.dtype == torch.float64 else mask
    with torch.autocast("cpu", dtype=torch.bfloat16):
        grouped = grouped_prefix_attention(*leaves[:3], fmask, *leaves[3:], prompt_mask, 0.3)
        plain = explicit_attention(leaves[0], *repeated(*leaves[1:3], fmask, *leaves[3:], prompt_mask, G), 0.3)
    assert grouped.dtype == plain.dtype == torch.bfloat16 and grouped.shape == plain.shape == truth.shape

    def err(a, b):
        return float((a.detach().double() - b).abs().max() / b.abs().max())

    assert err(grouped, truth) <= 1.5 * err(plain, truth) + 1e-3
    for name, a, b, t in zip("q k v prompt_k prompt_v".split(), torch.autograd.grad((grouped * w).sum(), leaves),
                             torch.autograd.grad((plain * w).sum(), leaves), truth_grads):  # fmt: skip
        assert a.dtype == torch.float32 and err(a, t) <= 1.5 * err(b, t) + 1e-3, name


def test_bf16_autocast_takes_the_grouped_products_unless_switched_off(llama, monkeypatch):
    from rlvr.models import attention

    grouped_calls: list = []
    real_grouped = prefix_attention.grouped_prefix_attention
    monkeypatch.setattr(prefix_attention, "grouped_prefix_attention", lambda *a: grouped_calls.append(1) or real_grouped(*a))
    model = llama.float()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _logp_grads(model, _batch(), shared=True)
            assert len(grouped_calls) == 3  # every layer
            monkeypatch.setattr(attention, "GROUPED_UNDER_BF16", False)
            _logp_grads(model, _batch(), shared=True)
            assert len(grouped_calls) == 3  # the repeated prompt: explicit_attention's products in bf16
    finally:
        llama.double()


@pytest.mark.parametrize(
    "query_dtype,value_dtype,autocast",
    [(torch.float32, torch.bfloat16, True), (torch.bfloat16, torch.bfloat16, True), (torch.float32, torch.float32, False)],
)
def test_regrouping_in_one_copy_gives_autograds_bits(query_dtype, value_dtype, autocast, monkeypatch):
    """The regrouped queries, keys and values (one copy each way) against the same as autograd's cast, reshape and
    scale: the output and every gradient bit for bit, under bf16 autocast (the rotation's fp32 q and k, or bf16 ones;
    a scale that is not a power of two) and in fp32."""
    U, G, H, Hkv, P, C, D = 3, 5, 6, 3, 11, 7, 24
    g = torch.Generator().manual_seed(4)

    def leaf(*shape, dtype):
        return torch.randn(*shape, generator=g).to(dtype).requires_grad_()

    q, k = leaf(U * G, H, C, D, dtype=query_dtype), leaf(U * G, Hkv, C, D, dtype=query_dtype)
    v, pk, pv = leaf(U * G, Hkv, C, D, dtype=value_dtype), leaf(U, Hkv, P, D, dtype=value_dtype), leaf(U, Hkv, P, D, dtype=value_dtype)
    prompt_mask = torch.arange(P)[None] >= torch.tensor([0, 2, 5])[:, None]
    w = torch.randn(U * G, C, H, D, generator=g)
    results = []
    for regrouped in (False, True):
        monkeypatch.setattr(prefix_attention, "REGROUPED", regrouped)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = grouped_prefix_attention(q, k, v, None, pk, pv, prompt_mask, D**-0.5)
        results.append([out, *torch.autograd.grad((out.float() * w).sum(), (q, k, v, pk, pv))])
    for name, a, b in zip("out q k v prompt_k prompt_v".split(), *results):
        assert a.dtype == b.dtype and torch.equal(a, b), name
