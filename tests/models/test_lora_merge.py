"""LoRA adapters merged into their base weights while generating (rlvr.models.lora_merge): the same function as peft's
adapter up to rounding (bounded here against float64), the model untouched after the region, merged weights remade
when a weight changes, and layers whose forward is not W x + s B A x left as they are."""

from __future__ import annotations

import pytest
import torch

from rlvr.models.forward import completion_logprobs
from rlvr.models.loading import load_tokenizer
from rlvr.models.lora_merge import _MERGED, merged_lora_in
from rlvr.models.precision import autocast_context
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.engines.protocols import SamplingParams

pytest.importorskip("peft")
from _lora import adapted, tiny_lora  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture
def lora(tiny_model_dir):
    return tiny_lora(tiny_model_dir), load_tokenizer(tiny_model_dir, False)[0]


def test_a_merged_layer_computes_the_adapter_function_to_rounding(lora):
    model, _ = lora
    layer = model.get_base_model().model.layers[0].mlp.up_proj
    A, B, W = layer.lora_A["default"].weight, layer.lora_B["default"].weight, layer.base_layer.weight
    x = torch.randn(5, W.shape[1], generator=torch.Generator().manual_seed(2))
    exact = x.double() @ (W.double() + 2.0 * B.double() @ A.double()).T  # scaling = alpha / r = 2
    with torch.no_grad():
        plain = layer(x)
        with merged_lora_in(model, torch.float32) as n:
            merged = layer(x)
    assert n == len(adapted(model)) == 7 * model.config.num_hidden_layers
    assert (merged.double() - exact).abs().max() < 1e-5 and (plain.double() - exact).abs().max() < 1e-5


def test_bf16_generation_keeps_the_adapter_apart_as_training_does(lora):
    """Under bf16 nothing is merged (a bf16 W' rounds unlike the training forward: rlvr.models.lora_merge says why)."""
    model, tok = lora
    with merged_lora_in(model, torch.bfloat16) as n:
        assert n == 0
    plain, merged = (_generate(model, tok, merge=m, bf16=True, temperature=1.0) for m in (False, True))
    assert torch.equal(plain.completion_ids, merged.completion_ids)
    assert torch.equal(plain.sampling_logprobs, merged.sampling_logprobs)


def _generate(model, tok, merge: bool, bf16: bool, temperature: float):
    params = SamplingParams(n=3, temperature=temperature, max_new_tokens=8)
    with torch.no_grad(), autocast_context("bf16" if bf16 else "none", CPU, model):
        return HFEngine(model, tok, merge_lora=merge).generate(["12+7=", "3*4=", "5+5="], params, [5, 6, 7])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_merged_draws_the_same_tokens_and_log_probs_to_rounding(lora, temperature):
    model, tok = lora
    calls = []
    hooks = [m.lora_A["default"].register_forward_hook(lambda *a: calls.append(1)) for m in adapted(model)]
    plain = _generate(model, tok, merge=False, bf16=False, temperature=temperature)
    n_plain, calls[:] = len(calls), []
    merged = _generate(model, tok, merge=True, bf16=False, temperature=temperature)
    for h in hooks:
        h.remove()
    assert n_plain > 0 and calls == []  # merged: no adapter product ran
    assert torch.equal(plain.completion_ids, merged.completion_ids)
    assert (plain.sampling_logprobs - merged.sampling_logprobs).abs().max() < 1e-5


def test_fp32_sampler_log_probs_match_the_training_forward(lora):
    """The sampler's log-probs against the training forward's (what algo.sampler_correction would correct)."""
    model, tok = lora
    gen = _generate(model, tok, merge=True, bf16=False, temperature=1.0)
    with torch.no_grad():
        trained = completion_logprobs(model, gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask).logp
    m = gen.completion_mask.bool()
    assert (trained - gen.sampling_logprobs)[m].abs().max() < 1e-4


def test_the_model_is_untouched_after_the_region_and_training_sees_the_adapter(lora):
    model, tok = lora
    before = {n: (p, p.detach().clone()) for n, p in model.named_parameters()}
    _generate(model, tok, merge=True, bf16=True, temperature=1.0)
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    assert all(after[n] is p and torch.equal(p, v) for n, (p, v) in before.items())
    assert all(m.merged_adapters == [] and not m.merged for m in adapted(model))
    assert not any(m in _MERGED for m in adapted(model))  # a trainer's region keeps no merged copy
    ids = torch.tensor([[5, 6, 7, 8]])
    model(input_ids=ids).logits.sum().backward()  # gradients reach the adapters again
    assert all(m.lora_A["default"].weight.grad is not None for m in adapted(model))


def test_kept_merged_weights_are_reused_until_a_weight_changes(lora):
    model, _ = lora
    layer = adapted(model)[0]
    with torch.no_grad():
        with merged_lora_in(model, torch.float32, keep=True):
            first = layer.base_layer.weight
        with merged_lora_in(model, torch.float32, keep=True):
            assert layer.base_layer.weight is first  # nothing changed: the same W'
        layer.lora_B["default"].weight.add_(1.0)  # an optimizer step writes in place
        with merged_lora_in(model, torch.float32, keep=True):
            remade = layer.base_layer.weight
    A, B, W = (t.detach() for t in (layer.lora_A["default"].weight, layer.lora_B["default"].weight, layer.base_layer.weight))
    assert remade is not first and torch.allclose(remade, W + 2.0 * B @ A, atol=1e-5)


def test_layers_that_are_not_a_plain_adapter_are_left_alone(tiny_model_dir):
    dora = tiny_lora(tiny_model_dir, use_dora=True)
    with merged_lora_in(dora, torch.float32) as n:
        assert n == 0
    dropout = tiny_lora(tiny_model_dir, lora_dropout=0.1)
    dropout.train()  # dropout on the adapter's input is live: not a linear function
    with merged_lora_in(dropout, torch.float32) as n:
        assert n == 0
    dropout.eval()
    with merged_lora_in(dropout, torch.float32) as n:
        assert n == len(adapted(dropout))
    with dropout.disable_adapter(), merged_lora_in(dropout, torch.float32) as n:  # the reference policy
        assert n == 0


class _Wrapped(torch.Tensor):
    """A tensor subclass standing in for FSDP's DTensor or a quantised weight: not a plain strided tensor."""


def test_weights_that_are_tensor_subclasses_are_left_alone(lora):
    model, _ = lora
    layer = model.get_base_model().model.layers[0].mlp.up_proj
    x = torch.randn(3, layer.base_layer.weight.shape[1], generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain = layer(x)
        layer.base_layer.weight = torch.nn.Parameter(layer.base_layer.weight.data.as_subclass(_Wrapped))
        with merged_lora_in(model, torch.float32) as n:
            assert n == len(adapted(model)) - 1  # every other layer merged
            assert layer.merged_adapters == [] and type(layer.base_layer.weight) is _Wrapped
            same = layer(x)
    assert torch.equal(same.as_subclass(torch.Tensor), plain)
