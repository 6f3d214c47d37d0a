"""Decode products from pre-packed weights (rlvr.models.packed_linears): under CPU bf16 autocast the generation's
tokens and log-probs are bit for bit those of autocast's own products, for a fully trained model and for LoRA
(peft's base layers, frozen, from their kept bf16 copies; Qwen2's projection biases); in fp32 the large weights
run packed, the same tokens and log-probs to float rounding. Packed copies are dropped after a trainer's region
and kept for a server's until the weight is written; each module's own forward is back after the region; calls
with gradients and prefill-sized calls run as before."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import rlvr.models.packed_linears as packed_linears
import rlvr.models.precision as precision
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.models.precision import autocast_context
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.engines.protocols import SamplingParams

CPU = torch.device("cpu")
# oneDNN's bf16 products (AVX-512 CPUs): elsewhere nothing can pack in bf16, and the bf16 tests check that instead
BF16_KERNELS = torch.ops.mkldnn._is_mkldnn_bf16_supported()


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


@pytest.fixture
def packed_modules(monkeypatch):
    """The modules whose products ran from a packed weight (every call to rlvr.models.packed_linears._packed)."""
    seen: list[torch.nn.Module] = []
    packed = packed_linears._packed

    def spy(module, rows, dtype, way):
        seen.append(module)
        return packed(module, rows, dtype, way)

    monkeypatch.setattr(packed_linears, "_packed", spy)
    return seen


@pytest.mark.parametrize("lean", [True, False])
def test_generation_is_bit_for_bit_autocasts_and_trainable_copies_are_dropped(tiny_model_dir, monkeypatch, packed_modules, lean):
    tok, _ = load_tokenizer(tiny_model_dir, False)
    model = load_model(tiny_model_dir, "float32", CPU, False)
    kw = {"lean": lean}
    plain = _generate(model, tok, False, monkeypatch, kw)
    assert not packed_modules
    packed = _generate(model, tok, True, monkeypatch, kw)
    _assert_same(plain, packed)
    linears = _linears(model)
    assert set(packed_modules) == (set(linears) if BF16_KERNELS else set())  # every projection and the head ran packed
    assert not any("forward" in m.__dict__ for m in linears)  # their own forward is back
    assert not any(m in packed_linears._PACKED for m in linears)  # trainable: stale after the next step, dropped


def test_lora_base_layers_and_biases_generate_bit_for_bit_and_are_packed_again_after_a_write(monkeypatch, packed_modules):
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
    plain, packed = _generate(model, tok, False, monkeypatch), _generate(model, tok, True, monkeypatch)
    _assert_same(plain, packed)
    base_q = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    adapter = model.get_base_model().model.layers[0].self_attn.q_proj.lora_A["default"]
    assert base_q not in packed_linears._PACKED  # a trainer's region: dropped at its end
    server = {"keep_merged": True}  # a generation server's: kept while the weight is unchanged
    assert torch.equal(_generate(model, tok, True, monkeypatch, server).completion_ids, plain.completion_ids)
    if not BF16_KERNELS:
        assert not packed_modules and base_q not in packed_linears._PACKED  # nothing packs, nothing is kept
        return
    assert base_q in packed_modules and adapter in packed_modules
    kept = packed_linears._PACKED[base_q]
    assert kept[3] is not None  # packed with its bias
    _generate(model, tok, True, monkeypatch, server)
    assert packed_linears._PACKED[base_q][2] is kept[2]  # same weight: packed once
    with torch.no_grad():
        base_q.weight.mul_(-1.0)  # written in place (a load): a new version, packed again
    changed_plain, changed_packed = _generate(model, tok, False, monkeypatch), _generate(model, tok, True, monkeypatch, server)
    assert packed_linears._PACKED[base_q][2] is not kept[2]
    _assert_same(changed_plain, changed_packed)
    assert not torch.equal(changed_plain.sampling_logprobs, plain.sampling_logprobs)


def _llama_256():

    from rlvr.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    torch.manual_seed(5)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config), tok


@pytest.mark.parametrize("way", ["onednn", "native"])
def test_fp32_generation_packs_the_large_weights_and_equals_the_plain_path_to_rounding(monkeypatch, packed_modules, way):
    MIN = packed_linears.FP32_MIN_WEIGHT
    monkeypatch.setattr(
        packed_linears, "fp32_way", lambda i, o, rows: way if way == "native" or i * min(np.atleast_1d(o)) >= MIN else "plain"
    )
    model, tok = _llama_256()  # as where that way measures fastest (oneDNN's never below FP32_MIN_WEIGHT)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=16)

    def generate(packed: bool, **kw):
        monkeypatch.setattr(packed_linears, "DECODE_ROWS_MAX", 256 if packed else 0)
        with torch.no_grad():
            return HFEngine(model, tok, **kw).generate(["12+7=", "3*4=", "100-1="], params, [5, 6, 7])

    for lean in (True, False):
        plain, packed = generate(False, lean=lean), generate(True, lean=lean)
        assert torch.equal(plain.completion_ids, packed.completion_ids)
        torch.testing.assert_close(packed.sampling_logprobs, plain.sampling_logprobs, rtol=0, atol=1e-5)
        assert not torch.equal(packed.sampling_logprobs, plain.sampling_logprobs)  # another order of the sums
    layer, ran = model.model.layers[0], set(packed_modules)
    assert {layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.down_proj} <= ran  # 256 x 256 and larger
    # k and v (128 x 256) and the lm_head (~100 x 256) are too small for oneDNN's products, and q decides its way with
    # k and v (packed_linears.GROUPS): all packed natively, none for oneDNN
    small = {layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, model.lm_head}
    assert small <= ran if way == "native" else not small & ran


def test_fp32_packing_is_measured_once_per_shape_and_machine_then_read_from_the_cache(tmp_path, monkeypatch, packed_modules):
    """Each weight shape, or each group's (q/k/v, gate/up: packed_linears.GROUPS), is measured once per rows bucket
    with the ways that can take it (oneDNN's from FP32_MIN_WEIGHT up), kept in packing.json and read from there."""
    monkeypatch.setenv("RLVR_PRECISION_CACHE", str(tmp_path / "precision.json"))
    monkeypatch.setattr(packed_linears, "_FP32_CHOICES", {})
    model, tok = _llama_256()  # q 256 x 256, k and v 128 x 256 each, gate and up 512 x 256, down 256 x 512
    V = model.lm_head.out_features
    timed = []

    def timing(i, o, rows, ways):  # seconds per way: the native kernel fastest for o_proj, oneDNN for gate/up
        timed.append((i, o, rows, ways))
        fastest = {(256, 256): "native", (256, (512, 512)): "onednn"}.get((i, o), "plain")
        return {w: 1.0 if w == fastest else 1.9 + 0.1 * (w == "plain") for w in ("plain", *ways)}

    monkeypatch.setattr(packed_linears, "_time_fp32", timing)
    with torch.no_grad():
        HFEngine(model, tok).generate(["12+7=", "3*4="], SamplingParams(n=4, temperature=1.0, max_new_tokens=8), [5, 6])
    layer = model.model.layers[0]
    assert {layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj} <= set(packed_modules)
    assert not {layer.mlp.down_proj, layer.self_attn.q_proj, layer.self_attn.k_proj, model.lm_head} & set(packed_modules)  # slower
    assert packed_linears._PACKED.get(layer.self_attn.o_proj) is None  # a trainer's region: dropped at its end
    # once per shape and row bucket (the prefill's 16 rows and its 2 rows of logits, the decode's 8), not per layer or call
    shapes = [(i, o, rows) for i, o, rows, _ in timed]
    assert len(shapes) == len(set(shapes)) and {rows for _, _, rows in shapes} <= {2, 8, 16} and (256, 256, 8) in shapes
    ways = {(256, (256, 128, 128)): ("native",), (256, 256): ("onednn", "native"), (256, (512, 512)): ("onednn", "native")}
    ways |= {(512, 256): ("onednn", "native"), (256, V): ("native",)}  # the small lm_head: the native kernel's only
    assert {(i, o): w for i, o, _, w in timed} == ways
    cache = json.loads((tmp_path / "packing.json").read_text())
    chosen = {(256, 256): "native", (256, (512, 512)): "onednn"}

    def entry(key: str, e: dict) -> tuple:
        k = json.loads(key)
        return k["in"], k["out"] if isinstance(k["out"], int) else tuple(k["out"]), k["rows"], e["way"]

    assert {entry(k, e) for k, e in cache.items()} == {(i, o, rows, chosen.get((i, o), "plain")) for i, o, rows in shapes}
    n = len(timed)
    assert packed_linears.fp32_way(256, 256, 5) == "native" and packed_linears.fp32_way(512, 256, 7) == "plain"  # bucket 8
    assert len(timed) == n
    monkeypatch.setattr(packed_linears, "_FP32_CHOICES", {})  # a new process on this machine: the file decides
    assert packed_linears.fp32_way(256, 256, 8) == "native" and packed_linears.fp32_way(256, (512, 512), 8) == "onednn"
    assert len(timed) == n
    assert packed_linears.fp32_way(256, 256, 64) == "native" and timed[-1][:3] == (256, 256, 64)  # 64 rows: measured anew
    assert len(timed) == n + 1


def test_fp32_packing_measurement_times_every_way(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_PRECISION_CACHE", str(tmp_path / "precision.json"))
    monkeypatch.setattr(packed_linears, "_FP32_CHOICES", {})
    way = packed_linears.fp32_way(320, 320, 40)
    (key, entry), = json.loads((tmp_path / "packing.json").read_text()).items()  # fmt: skip
    assert json.loads(key) | {"cpu": None, "torch": None} == {
        "cpu": None, "torch": None, "threads": torch.get_num_threads(), "in": 320, "out": 320, "rows": 64, "ways": "onednn,native"
    }  # fmt: skip
    times = {w: entry[f"{w}_s"] for w in ("plain", "onednn", "native")}
    assert all(0 < t < 0.1 for t in times.values()) and len(entry) == 4
    fastest = min(("onednn", "native"), key=times.get)
    assert way == entry["way"] == (fastest if times[fastest] <= packed_linears.FP32_PACKED_AT_MOST * times["plain"] else "plain")


def test_a_groups_way_is_measured_as_it_runs_small_weights_without_onednn(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_PRECISION_CACHE", str(tmp_path / "precision.json"))
    monkeypatch.setattr(packed_linears, "_FP32_CHOICES", {})
    way = packed_linears.fp32_way(128, (128, 128, 128), 40)  # the tiny model's q, k and v: 128 x 128 each
    (key, entry), = json.loads((tmp_path / "packing.json").read_text()).items()  # fmt: skip
    assert json.loads(key) | {"cpu": None, "torch": None} == {
        "cpu": None, "torch": None, "threads": torch.get_num_threads(), "in": 128, "out": [128, 128, 128], "rows": 64, "ways": "native"
    }  # fmt: skip
    times = {w: entry[f"{w}_s"] for w in ("plain", "native")}
    assert all(0 < t < 0.1 for t in times.values()) and len(entry) == 3
    assert way == entry["way"] == ("native" if times["native"] <= packed_linears.FP32_PACKED_AT_MOST * times["plain"] else "plain")
    assert packed_linears.fp32_way(128, (128, 128, 128), 33) == way and len(json.loads((tmp_path / "packing.json").read_text())) == 1


def test_a_region_groups_each_layers_q_k_v_and_gate_up_up_to_GROUP_MAX_IN_wide(tiny_model_dir):
    model = load_model(tiny_model_dir, "float32", CPU, False)  # 128 wide
    config = LlamaConfig(vocab_size=40, hidden_size=packed_linears.GROUP_MAX_IN + 64, intermediate_size=64, num_hidden_layers=1)
    wide = LlamaForCausalLM(config)
    with packed_linears.packed_linears_in(model), packed_linears.packed_linears_in(wide):
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            assert all(
                packed_linears._GROUP_OF[m] == (attn.q_proj, attn.k_proj, attn.v_proj) for m in (attn.q_proj, attn.k_proj, attn.v_proj)
            )
            assert all(packed_linears._GROUP_OF[m] == (mlp.gate_proj, mlp.up_proj) for m in (mlp.gate_proj, mlp.up_proj))
            assert attn.o_proj not in packed_linears._GROUP_OF and mlp.down_proj not in packed_linears._GROUP_OF
        assert not any(m in packed_linears._GROUP_OF for m in wide.modules())  # wider: each projection decides alone
    assert len(packed_linears._GROUP_OF) == 0  # dropped with the regions
    from peft import LoraConfig, get_peft_model

    adapted = get_peft_model(load_model(tiny_model_dir, "float32", CPU, False), LoraConfig(r=4, target_modules=["q_proj"]))
    with packed_linears.packed_linears_in(adapted):  # q under an adapter is no Linear: k and v decide alone, gate/up together
        layer = adapted.base_model.model.model.layers[0]
        assert layer.self_attn.k_proj not in packed_linears._GROUP_OF and layer.self_attn.q_proj.base_layer not in packed_linears._GROUP_OF
        assert packed_linears._GROUP_OF[layer.mlp.up_proj] == (layer.mlp.gate_proj, layer.mlp.up_proj)


def test_calls_with_gradients_prefill_sized_or_small_fp32_run_as_before(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_PRECISION_CACHE", str(tmp_path / "precision.json"))
    monkeypatch.setattr(packed_linears, "_FP32_CHOICES", {})
    measured = []  # the ways each shape was timed with; F.linear measured fastest
    monkeypatch.setattr(
        packed_linears, "_time_fp32", lambda i, o, rows, ways: measured.append(ways) or {"plain": 1.0} | dict.fromkeys(ways, 2.0)
    )
    model = load_model(tiny_model_dir, "float32", CPU, False)
    q = model.model.layers[0].self_attn.q_proj
    x = torch.randn(5, q.in_features)
    assert q.weight.numel() < packed_linears.FP32_MIN_WEIGHT
    with packed_linears.packed_linears_in(model), torch.no_grad():  # fp32, a small weight measured fastest plain: F.linear's own product
        assert "forward" in q.__dict__ and torch.equal(q(x), torch.nn.functional.linear(x, q.weight, q.bias))
        assert q not in packed_linears._PACKED
    assert measured == [("native",)]  # q/k/v's group, once: oneDNN's never timed on a small weight
    with torch.autocast("cpu", dtype=torch.bfloat16), packed_linears.packed_linears_in(model):
        assert "forward" in q.__dict__
        y = q(x)  # gradients on: autocast's own product
        assert y.requires_grad and q not in packed_linears._PACKED
        with torch.no_grad():
            assert torch.equal(q(x), torch.nn.functional.linear(x, q.weight, q.bias))
        assert (q in packed_linears._PACKED) == BF16_KERNELS
        k, prefill = model.model.layers[0].self_attn.k_proj, torch.randn(3, 100, q.in_features)  # 300 rows: a prefill
        with torch.no_grad():
            assert torch.equal(k(prefill), torch.nn.functional.linear(prefill, k.weight, k.bias))
        assert k not in packed_linears._PACKED


def test_no_bf16_packing_where_bf16_is_emulated_even_when_autocast_starts_inside_the_region(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    model = load_model(tiny_model_dir, "float32", CPU, False)
    q = model.model.layers[0].self_attn.q_proj
    x = torch.randn(5, q.in_features)
    with packed_linears.packed_linears_in(model), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert "forward" in q.__dict__  # swapped (fp32 calls may pack), but a bf16 call is autocast's own
        assert torch.equal(q(x), torch.nn.functional.linear(x, q.weight, q.bias)) and q not in packed_linears._PACKED


def test_overlapping_regions_restore_the_forward_when_the_last_one_exits(tiny_model_dir):
    """The agent endpoint's decoder thread holds a region for its lifetime while the engine generates on the same
    model: the first region to exit must not take the swapped forward from the other."""
    model = load_model(tiny_model_dir, "float32", CPU, False)
    q = model.model.layers[0].self_attn.q_proj
    first, second = packed_linears.packed_linears_in(model), packed_linears.packed_linears_in(model)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert "forward" in q.__dict__  # the second region still runs it
    second.__exit__(None, None, None)
    assert "forward" not in q.__dict__ and q not in packed_linears._HOLDERS


def test_fused_decode_weight_gives_the_separate_products_bits_and_only_where_they_would_pack(monkeypatch):
    """q, k and v as one packed bf16 product (the lean decode's fusion): each output the bits of its module's own call in
    the region; one packed copy for every rows bucket, packed again after a write; None outside bf16 autocast, outside a
    region, past the decode's rows, or where the machine's check (_fuses_exactly) finds other bits; and on a CPU
    without oneDNN's bf16 kernels, where the lean decode asks with bf16_ok = bf16_packs()."""
    model, _ = _llama_256()
    attn = model.model.layers[0].self_attn
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)  # 256 + 128 + 128 outputs
    x = torch.randn(24, 256)
    if not BF16_KERNELS:
        with torch.no_grad(), packed_linears.packed_linears_in(model), torch.autocast("cpu", dtype=torch.bfloat16):
            assert not packed_linears.bf16_packs() and packed_linears.fused_decode_weight(projections, 24, False) is None
        return
    with torch.no_grad():
        assert packed_linears.fused_decode_weight(projections, 24, True) is None  # no region
        with packed_linears.packed_linears_in(model):
            assert packed_linears.fused_decode_weight(projections, 24, True) is None  # fp32: k and v too small to pack
            with torch.autocast("cpu", dtype=torch.bfloat16):
                weight, bias, way = packed_linears.fused_decode_weight(projections, 24, True)
                assert way == "onednn"
                fused = torch.ops.mkldnn._linear_pointwise(x.bfloat16(), weight, bias, "none", [], "")
                assert torch.equal(fused, torch.cat([m(x) for m in projections], -1))
                assert packed_linears.fused_decode_weight(projections, 24, False) is None  # no fast bf16: nothing packs
                assert packed_linears.fused_decode_weight(projections, 300, True) is None  # a prefill's rows
                assert packed_linears.fused_decode_weight(projections, 5, True)[0] is weight  # another rows bucket: one copy
                attn.k_proj.weight.mul_(2.0)  # written in place (an optimizer step, a load): packed again, with it
                again, _, _ = packed_linears.fused_decode_weight(projections, 24, True)
                assert again is not weight
                assert torch.equal(
                    torch.ops.mkldnn._linear_pointwise(x.bfloat16(), again, bias, "none", [], ""),
                    torch.cat([m(x) for m in projections], -1),
                )
                monkeypatch.setattr(packed_linears, "_fuses_exactly", lambda *shape: False)
                assert packed_linears.fused_decode_weight(projections, 24, True) is None
    assert attn.q_proj not in packed_linears._FUSED  # dropped with the region, as the modules' own packed weights


def test_a_trained_model_generates_the_bits_a_frozen_one_does(tiny_model_dir):
    """aten's matmul picks its kernel for a prefill's 3-d input by whether the weight requires grad, and on an Intel Xeon
    the two round differently (a log-prob 1 ulp apart): inside the generation region an unpacked product reads its
    weight detached, so the trainer's in-process engine samples what a generation server's frozen copy samples."""
    tok, _ = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir, "float32", CPU, False)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6)
    prompts = ["12+7=", "3*4=", "100-1="]
    trained = HFEngine(model, tok).generate(prompts, params, [5, 6, 7])
    model.requires_grad_(False)
    frozen = HFEngine(model, tok).generate(prompts, params, [5, 6, 7])
    assert torch.equal(trained.completion_ids, frozen.completion_ids)
    assert torch.equal(trained.sampling_logprobs, frozen.sampling_logprobs)


def test_fp32_native_products_fuse_with_each_projections_bits_and_oneDNNs_do_not(monkeypatch):
    """gate and up as one native fp32 product: each half exactly its module's own call in the region (each output its
    own chain), packed again after a write; with oneDNN's fp32 products (sums in another order fused), or where the two
    would run different ways, they stay apart."""
    model, _ = _llama_256()
    mlp = model.model.layers[0].mlp
    projections = (mlp.gate_proj, mlp.up_proj)  # 512 + 512 outputs of 256 inputs
    x = torch.randn(24, 256)
    monkeypatch.setattr(packed_linears, "fp32_way", lambda i, o, rows: "native")
    with torch.no_grad(), packed_linears.packed_linears_in(model):
        weight, bias, way = packed_linears.fused_decode_weight(projections, 24, False)
        assert way == "native" and bias is None
        fused = packed_linears.packed_product(x, weight, bias, way, 1024)
        assert torch.equal(fused, torch.cat([m(x) for m in projections], -1))
        assert packed_linears.fused_decode_weight(projections, 5, False)[0] is weight  # another rows bucket: one copy
        mlp.up_proj.weight.mul_(2.0)  # an optimizer step: packed again
        again = packed_linears.fused_decode_weight(projections, 24, False)
        assert again[0] is not weight
        assert torch.equal(packed_linears.packed_product(x, *again, 1024), torch.cat([m(x) for m in projections], -1))
        monkeypatch.setattr(packed_linears, "fp32_way", lambda i, o, rows: "onednn")
        assert packed_linears.fused_decode_weight(projections, 24, False) is None
        monkeypatch.setattr(packed_linears, "fp32_way", lambda i, o, rows: "native" if o == (512, 512) else "plain")
        attn = model.model.layers[0].self_attn  # q/k/v's group measured fastest on F.linear: apart
        assert packed_linears.fused_decode_weight((attn.q_proj, attn.k_proj, attn.v_proj), 24, False) is None
        assert packed_linears.fused_decode_weight(projections, 24, False)[2] == "native"
        assert packed_linears.fused_decode_weight(projections, 24, False, ways=("onednn",)) is None  # not a way the caller fuses
