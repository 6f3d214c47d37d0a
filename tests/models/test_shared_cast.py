"""One input cast once for the products that read it (rlvr.models.shared_cast): under bf16 autocast Linears over the
shared copies give autocast's outputs and every gradient bit for bit, it applies only to plain (or LoRA) Linears under
a narrower autocast in a forward with gradients, Llama, Qwen2 and Qwen3 training forwards take it for every layer's
q/k/v and gate/up with the same log-probs and gradients as transformers' own layers, and with LoRA adapters on every
projection their base and A products share it with peft's bits."""

import pytest
import torch

from _tiny_lms import completion_batch, tiny_lm

from rlvr.models import native_grad_sum, shared_cast
from rlvr.models.forward import completion_logprobs


@pytest.mark.parametrize("n", [1, 2, 3])
def test_linears_over_one_cast_give_autocasts_bits(n):
    torch.manual_seed(0)
    linears = [torch.nn.Linear(16, 24), torch.nn.Linear(16, 12, bias=False), torch.nn.Linear(16, 40)][:n]
    leaf = torch.randn(5, 7, 16).requires_grad_()
    w = [torch.randn(5, 7, m.out_features) for m in linears]
    runs = []
    for shared in (False, True):
        for p in [leaf, *(p for m in linears for p in m.parameters())]:
            p.grad = None
        # not a leaf, as a norm's output: autocast keeps one cast of a leaf that needs a gradient (its weights')
        x = leaf * torch.logspace(-2, 2, 7)[:, None]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert shared_cast.applies(x, linears)
            inputs = shared_cast.shared(x, n, torch.bfloat16) if shared else (x,) * n
            outs = [m(i) for m, i in zip(linears, inputs)]
        sum((o.float() * wi).sum() for o, wi in zip(outs, w)).backward()
        runs.append([*outs, leaf.grad.clone(), *(p.grad.clone() for m in linears for p in m.parameters())])
    for a, b in zip(*runs):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert runs[1][n].dtype == torch.float32  # the gradient in x's dtype


def test_applies_only_where_one_cast_serves():
    linear, x = torch.nn.Linear(4, 4), torch.randn(3, 4, requires_grad=True)
    assert not shared_cast.applies(x, [linear])  # no autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert shared_cast.applies(x, [linear, linear])
        assert shared_cast.applies(x.detach(), [linear])  # no gradient to sum, one cast all the same
        copies = shared_cast.shared(x.detach(), 2, torch.bfloat16)
        assert not any(c.requires_grad for c in copies) and copies[0].data_ptr() == copies[1].data_ptr()
        assert not shared_cast.applies(x.bfloat16(), [linear])  # nothing to cast
        assert not shared_cast.applies(x, [linear, torch.nn.Sequential(linear)])  # not a plain Linear (a LoRA layer)
        with torch.no_grad():
            assert not shared_cast.applies(x, [linear])


def _same_bits_both_ways(model, monkeypatch, shared_calls: list[int]) -> None:
    """The training forward's log-probs and every trainable gradient under bf16 autocast, with shared_cast on (its
    `shared` called with these reader counts, in order) and off: bit for bit. Each run draws the same dropout masks."""
    prompt, prompt_mask, completion, completion_mask = completion_batch()
    calls: list[int] = []
    real = shared_cast.shared
    monkeypatch.setattr(shared_cast, "shared", lambda *a: calls.append(a[1]) or real(*a))
    runs = []
    for ours in (True, False):
        model.zero_grad(set_to_none=True)
        monkeypatch.setattr(shared_cast, "ON", ours)
        torch.manual_seed(0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = completion_logprobs(model, prompt, prompt_mask, completion, completion_mask)
        (out.logp * completion_mask).sum().backward()
        runs.append((out.logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
        assert calls == (shared_calls if ours else [])
        calls.clear()
    (lp_ours, g_ours), (lp_theirs, g_theirs) = runs
    assert torch.equal(lp_ours, lp_theirs)
    for name, grad in g_theirs.items():
        assert torch.equal(g_ours[name], grad), name


@pytest.mark.parametrize("one_pass_sum", [True, False])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_a_models_layers_take_it_with_transformers_bits(kind, one_pass_sum, monkeypatch):
    """Each layer's q/k/v and gate/up products read one cast of their input (counted), the log-probs and every
    parameter's gradient bit for bit as transformers' layers (which cast per product), the readers' gradients summed
    by native_grad_sum's pass or by torch's cast and adds."""
    monkeypatch.setattr(native_grad_sum, "ON", one_pass_sum)
    model = tiny_lm(kind, head_dim=8) if kind == "qwen3" else tiny_lm(kind)
    _same_bits_both_ways(model, monkeypatch, [3, 2, 3, 2])  # q/k/v and gate/up of each layer
    assert all("forward" not in m.__dict__ for m in model.modules())  # the block put the Linears' forward back


@pytest.mark.parametrize("dropout,one_pass_sum", [(0.0, True), (0.0, False), (0.2, True)])
def test_lora_layers_read_one_cast_with_pefts_bits(tiny_model_dir, dropout, one_pass_sum, monkeypatch):
    """With LoRA on every projection the base and A products of q/k/v (six readers) and of gate/up (four) read one cast
    of their input, o's and down's two each; the log-probs and every adapter's gradient bit for bit as each product
    casting its own. A live adapter dropout acts on the fp32 input: then nothing is shared."""
    pytest.importorskip("peft")
    from _lora import tiny_lora

    monkeypatch.setattr(native_grad_sum, "ON", one_pass_sum)
    model = tiny_lora(tiny_model_dir, lora_dropout=dropout)
    model.train()
    layers = model.base_model.model.config.num_hidden_layers
    _same_bits_both_ways(model, monkeypatch, [6, 4] * layers if dropout == 0 else [])
