"""Frozen Linear weights under CPU bf16 autocast run from kept bf16 copies (rlvr.models.precision.frozen_linears_in):
the same bits as autocast's cast at every call, in generation (tokens, log-probs) and in the training forward
(log-probs, the adapters' gradients); the model's own parameters are back after each region."""

from __future__ import annotations

import pytest
import torch

from rlvr.models.forward import completion_logprobs
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.models.precision import _FROZEN_COPIES, autocast_context
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.engines.protocols import SamplingParams

pytest.importorskip("peft")
CPU = torch.device("cpu")


@pytest.fixture
def lora(tiny_model_dir):
    """The tiny model with LoRA on every projection, its adapters moved off their no-op init."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    tok, _ = load_tokenizer(tiny_model_dir, False)
    model = get_peft_model(load_model(tiny_model_dir, "float32", CPU, False), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    return model, tok


def _frozen_linears(model) -> dict[str, torch.nn.Parameter]:
    return {f"{m}.{n}": p for m, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)
            for n, p in mod._parameters.items() if p is not None and not p.requires_grad}  # fmt: skip


def _logprobs_and_grads(model, swap: bool):
    g = torch.Generator().manual_seed(1)
    p_ids, c_ids = torch.randint(3, 40, (4, 7), generator=g), torch.randint(3, 40, (4, 9), generator=g)
    p_mask, c_mask = torch.ones_like(p_ids), torch.ones_like(c_ids)
    c_mask[1, 6:] = 0
    model.zero_grad(set_to_none=True)
    with autocast_context("bf16", CPU, model if swap else None):
        out = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, with_entropy=True, entropy_grad=True)
    ((out.logp * c_mask).sum() + out.entropy.sum()).backward()
    return out.logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_training_forward_and_gradients_are_bit_for_bit_the_cast_ones(lora):
    model, _ = lora
    params = _frozen_linears(model)
    assert params and all(p.dtype == torch.float32 for p in params.values())
    logp, grads = _logprobs_and_grads(model, swap=False)
    logp2, grads2 = _logprobs_and_grads(model, swap=True)
    assert torch.equal(logp, logp2)
    assert grads.keys() == grads2.keys() and all(torch.equal(grads[n], grads2[n]) for n in grads)
    assert _frozen_linears(model) == params  # the same Parameter objects are back, fp32
    assert all(p.dtype == torch.float32 for p in _frozen_linears(model).values())


def test_generation_is_bit_for_bit_the_cast_one_and_copies_are_kept_until_a_weight_changes(lora):
    model, tok = lora
    params, prompts = SamplingParams(n=3, temperature=1.0, max_new_tokens=6), ["12+7=", "3*4="]

    def generate(swap: bool):
        with torch.no_grad(), autocast_context("bf16", CPU, model if swap else None):
            return HFEngine(model, tok).generate(prompts, params, [5, 6])

    plain, swapped = generate(False), generate(True)
    assert torch.equal(plain.completion_ids, swapped.completion_ids)
    assert torch.equal(plain.sampling_logprobs, swapped.sampling_logprobs)
    q = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    kept = _FROZEN_COPIES[q]["weight"][2]
    assert kept.dtype == torch.bfloat16 and torch.equal(kept, q.weight.detach().to(torch.bfloat16))
    generate(True)
    assert _FROZEN_COPIES[q]["weight"][2] is kept  # made once, reused by the next region
    with torch.no_grad():
        q.weight.mul_(-1.0)  # written in place: the copy is stale and is made again
    changed_plain, changed_swapped = generate(False), generate(True)
    assert _FROZEN_COPIES[q]["weight"][2] is not kept
    assert torch.equal(changed_plain.sampling_logprobs, changed_swapped.sampling_logprobs)
    assert not torch.equal(changed_plain.sampling_logprobs, plain.sampling_logprobs)


def test_trainable_weights_and_other_precisions_are_left_alone(lora):
    model, _ = lora
    adapter = model.get_base_model().model.layers[0].self_attn.q_proj.lora_A["default"]
    before = dict(adapter._parameters)
    with autocast_context("bf16", CPU, model):
        assert adapter.weight is before["weight"] and adapter.weight.dtype == torch.float32  # trainable: autocast's own cache
        inside = _frozen_linears(model)
        assert inside and all(p.dtype == torch.bfloat16 for p in inside.values())
    with autocast_context("none", CPU, model):
        assert all(p.dtype == torch.float32 for p in _frozen_linears(model).values())
