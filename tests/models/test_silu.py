"""The training forward's SiLU (rlvr.models.silu): in place on a copy it computes transformers' bits, forward and
backward, whichever way this machine's measurement chose; through a real Llama's completion log-probs the same bits and
gradients; the choice is measured once and kept in silu.json; and used only where it is meant to be."""

import contextlib
import json

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.activations import SiLUActivation

from rlvr.models import silu as silu_module
from rlvr.models.forward import completion_logprobs
from rlvr.models.silu import fast_silu, silu


@pytest.fixture
def chosen(monkeypatch):
    """Force the machine's answer: chosen(forward, backward), and count the in-place calls."""
    calls = {"forward": 0, "backward": 0}
    forward, backward = silu_module._silu_in_place, silu_module._backward_in_place

    def counted(name, fn):
        def counting(*args):
            calls[name] += 1
            return fn(*args)

        return counting

    monkeypatch.setattr(silu_module, "_silu_in_place", counted("forward", forward))
    monkeypatch.setattr(silu_module, "_backward_in_place", counted("backward", backward))

    def choose(f: bool, b: bool):
        monkeypatch.setattr(silu_module, "in_place_pays", lambda dtype: {"forward": f, "backward": b})
        return calls

    return choose


@pytest.mark.parametrize("f,b", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_same_bits_forward_and_backward(chosen, monkeypatch, f, b, dtype):
    monkeypatch.setattr(silu_module, "MIN_NUMEL", 1)
    calls = chosen(f, b)
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(37, 129, generator=g) * 6).to(dtype).requires_grad_()
    grad = torch.randn(37, 129, generator=g).to(dtype)
    theirs = F.silu(x)
    (theirs_dx,) = torch.autograd.grad(theirs, x, grad)
    ours = silu(x)
    (ours_dx,) = torch.autograd.grad(ours, x, grad)
    assert torch.equal(ours, theirs) and torch.equal(ours_dx, theirs_dx)
    assert calls == {"forward": int(f or b), "backward": int(b)}  # neither pays: transformers' own, no node of ours
    with torch.no_grad():
        assert torch.equal(silu(x), theirs)
    assert calls["forward"] == int(f or b) + int(f)
    assert not grad.isnan().any() and x.grad is None  # the incoming gradient and the input are left as they were


def test_silu_outside_its_sizes_is_transformers_own(chosen):
    calls = chosen(True, True)
    small = torch.randn(64, 1376, requires_grad=True)  # below MIN_NUMEL
    large = torch.randn(silu_module.MAX_BYTES // 4 + 1)  # above MAX_BYTES in fp32
    assert torch.equal(silu(small), F.silu(small)) and torch.equal(silu(large), F.silu(large))
    assert calls == {"forward": 0, "backward": 0}
    middle = torch.randn(1 << 20)
    assert torch.equal(silu(middle), F.silu(middle)) and calls["forward"] == 1


def test_choice_measured_once_and_kept(monkeypatch, precision_cache):
    monkeypatch.setattr(silu_module, "_CHOICES", {})
    timed = []
    real = silu_module._time
    monkeypatch.setattr(silu_module, "_time", lambda dtype: timed.append(dtype) or real(dtype))
    first = silu_module.in_place_pays(torch.float32)
    assert set(first) == {"forward", "backward", "seconds"} and all(s > 0 for s in first["seconds"].values())
    assert first["forward"] == (first["seconds"]["forward_in_place"] <= silu_module.IN_PLACE_AT_MOST * first["seconds"]["forward"])
    silu_module._CHOICES.clear()  # a new process: read back from silu.json, not timed again
    assert silu_module.in_place_pays(torch.float32) == first and timed == [torch.float32]
    kept = json.loads(precision_cache.with_name("silu.json").read_text())
    assert any('"dtype": "float32"' in key and entry == first for key, entry in kept.items())


def _llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(config).float()


@pytest.mark.parametrize("grouped", [False, True])
def test_training_forward_same_logprobs_and_gradients(chosen, monkeypatch, grouped):
    monkeypatch.setattr(silu_module, "MIN_NUMEL", 1)  # the tiny model's activations count as large
    calls = chosen(True, True)
    model = _llama()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 97, (6, 7), generator=g)
    if grouped:
        prompt = prompt[[0, 0, 0, 3, 3, 3]]
    prompt_mask = torch.ones_like(prompt)
    completion = torch.randint(3, 97, (6, 5), generator=g)
    completion_mask = torch.ones_like(completion)
    completion_mask[2, 3:] = 0
    groups = torch.tensor([0, 0, 0, 1, 1, 1]) if grouped else None
    runs = []
    for fast in (True, False):
        model.zero_grad()
        if not fast:
            monkeypatch.setattr("rlvr.models.forward.fast_silu", lambda model: contextlib.nullcontext())
        out = completion_logprobs(model, prompt, prompt_mask, completion, completion_mask, group_ids=groups)
        (out.logp * completion_mask).sum().backward()
        runs.append((out.logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        if fast:
            passes = 2 if grouped else 1  # the shared-prefix forward runs the prompts, then the completions
            assert calls == {"forward": 2 * passes, "backward": 2 * passes}
    (lp_fast, g_fast), (lp_plain, g_plain) = runs
    assert torch.equal(lp_fast, lp_plain)
    for name, grad in g_plain.items():  # the same kernels: the same bits
        assert torch.equal(g_fast[name], grad), name


def test_block_swaps_and_restores_the_activation():
    model = _llama()
    act = model.model.layers[0].mlp.act_fn
    assert isinstance(act, SiLUActivation)
    with fast_silu(model):
        assert act.__dict__["forward"] is silu
        with fast_silu(model):
            pass
        assert act.__dict__["forward"] is silu  # a nested block leaves the outer one's swap behind it
    assert "forward" not in act.__dict__
    x = torch.randn(3, 5)
    assert torch.equal(act(x), F.silu(x))
