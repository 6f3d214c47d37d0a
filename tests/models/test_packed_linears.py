"""Decode products from pre-packed bf16 weights (rlvr.models.packed_linears): under CPU bf16 autocast the
generation's tokens and log-probs are bit for bit those of autocast's own products, for a fully trained model and
for LoRA (peft's base layers, frozen, from their kept bf16 copies; Qwen2's projection biases); a weight written in
place is packed again; each module's own forward is back after the region; calls with gradients are untouched."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import rlvr.models.packed_linears as packed_linears
import rlvr.models.precision as precision
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.models.precision import autocast_context
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.engines.protocols import SamplingParams

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="oneDNN has no bf16 kernels on this CPU: nothing is packed"
)


@pytest.fixture(autouse=True)
def packing_on_any_bf16_cpu(monkeypatch):
    """Where bf16 is emulated the engine does not pack (unmeasured there); the equality holds either way."""
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: True)


def _generate(model, tok, packed: bool, monkeypatch, engine_kw=None):
    monkeypatch.setattr(packed_linears, "DECODE_ROWS_MAX", 256 if packed else 0)  # 0: every call as before
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=12)
    with torch.no_grad(), autocast_context("bf16", CPU, model):
        return HFEngine(model, tok, **(engine_kw or {})).generate(["12+7=", "3*4=", "100-1="], params, [5, 6, 7])


def _linears(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def _assert_same(a, b):
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.sampling_logprobs, b.sampling_logprobs)
    assert torch.equal(a.sampling_entropy, b.sampling_entropy)


@pytest.mark.parametrize("lean", [True, False])
def test_generation_is_bit_for_bit_autocasts_and_packs_again_after_a_write(tiny_model_dir, monkeypatch, lean):
    tok, _ = load_tokenizer(tiny_model_dir, False)
    model = load_model(tiny_model_dir, "float32", CPU, False)
    kw = {"lean": lean}
    plain, packed = _generate(model, tok, False, monkeypatch, kw), _generate(model, tok, True, monkeypatch, kw)
    _assert_same(plain, packed)
    linears = _linears(model)
    assert all(m in packed_linears._PACKED for m in linears)  # every projection and the head ran packed
    assert not any("forward" in m.__dict__ for m in linears)  # their own forward is back
    q = model.model.layers[0].self_attn.q_proj
    kept = packed_linears._PACKED[q][2]
    _generate(model, tok, True, monkeypatch, kw)
    assert packed_linears._PACKED[q][2] is kept  # same weights: packed once
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # as an optimizer step: in place, a new version
    changed_plain, changed_packed = _generate(model, tok, False, monkeypatch, kw), _generate(model, tok, True, monkeypatch, kw)
    assert packed_linears._PACKED[q][2] is not kept
    _assert_same(changed_plain, changed_packed)
    assert not torch.equal(changed_plain.sampling_logprobs, plain.sampling_logprobs)


def test_lora_and_biases_generate_bit_for_bit(monkeypatch):
    from peft import LoraConfig, get_peft_model

    from rlvr.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    torch.manual_seed(3)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, attn_implementation="sdpa",
    )  # fmt: skip
    model = get_peft_model(Qwen2ForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    _assert_same(_generate(model, tok, False, monkeypatch), _generate(model, tok, True, monkeypatch))
    base_q = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    assert base_q in packed_linears._PACKED and packed_linears._PACKED[base_q][3] is not None  # packed, with its bias


def test_calls_with_gradients_or_without_bf16_autocast_run_as_before(tiny_model_dir):
    model = load_model(tiny_model_dir, "float32", CPU, False)
    q = model.model.layers[0].self_attn.q_proj
    x = torch.randn(5, q.in_features)
    with packed_linears.packed_linears_in(model):
        assert "forward" not in q.__dict__  # no autocast: nothing swapped
    with torch.autocast("cpu", dtype=torch.bfloat16), packed_linears.packed_linears_in(model):
        assert "forward" in q.__dict__
        y = q(x)  # gradients on: autocast's own product
        assert y.requires_grad and q not in packed_linears._PACKED
        with torch.no_grad():
            assert torch.equal(q(x), torch.nn.functional.linear(x, q.weight, q.bias))
        assert q in packed_linears._PACKED
