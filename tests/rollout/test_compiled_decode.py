"""The lean decode step with its layers under torch.compile (rollout.compile=on; compiled_decode.py) against the
plain path (transformers' own forward): the same tokens, log-probs and entropies to 1e-4 in fp32, in both KV
layouts, with rows leaving the batch (the shared layout's graph with some of a group's rows), projection biases
and grouped-query heads (Qwen2), per-head q/k norms (Qwen3), a LoRA adapter merged for generation; under bf16
autocast against the eager lean step, step by step on the same tokens. Each test checks that the compiled
layers ran: the step falls back to eager wherever a layer is not plain enough, which would pass unseen."""

import pytest
import torch

import rlvr.rollout.engines.hf.steps as steps
from rlvr.data import render_prompt
from rlvr.rollout import SamplingParams
from rlvr.config import ConfigError, load_config
from rlvr.models import precision
from rlvr.rollout.engines import make_engine
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.engines.hf.compiled_decode import CompiledLayers
from rlvr.rollout.engines.hf.forward import generation_mode, prefill
from rlvr.rollout.engines.hf.steps import choose_layout, start_decode
from rlvr.training.setup import check_config
from tests.rollout.test_lean_decode import QUESTIONS, _generate, _model, with_lora


@pytest.fixture
def compiled_calls(monkeypatch):
    calls = []
    call = CompiledLayers.__call__
    monkeypatch.setattr(CompiledLayers, "__call__", lambda self, *a: calls.append(a[-1][5] is not None) or call(self, *a))
    return calls


def _close(compiled, plain):
    assert torch.equal(compiled.completion_ids, plain.completion_ids) and torch.equal(compiled.completion_mask, plain.completion_mask)
    torch.testing.assert_close(compiled.sampling_logprobs, plain.sampling_logprobs, rtol=0, atol=1e-4)
    torch.testing.assert_close(compiled.sampling_entropy, plain.sampling_entropy, rtol=0, atol=1e-4)


@pytest.mark.parametrize("layout", ["repeated", "shared"])
def test_compiled_decode_same_as_plain_path(layout, monkeypatch, compiled_calls):
    """Qwen2 (projection biases, grouped-query heads) with LoRA adapters, which generate merged into their base."""
    torch.set_num_threads(1)
    tok, model = _model("qwen2")
    model = with_lora(model, ["q_proj", "v_proj", "down_proj"])
    monkeypatch.setattr(steps, "SHARED_PREFIX_MIN_PROMPT", 0 if layout == "shared" else 10**6)
    params = SamplingParams(n=6, temperature=1.0, max_new_tokens=20)
    plain = _generate(model, tok, params, static_cache=False, drop_finished_fraction=0.01)
    compiled = _generate(model, tok, params, drop_finished_fraction=0.01, compile_decode=True)
    assert compiled_calls and set(compiled_calls) == {layout == "shared"}  # every step compiled, in the layout asked
    assert ((plain.completion_mask.sum(-1) < 20) & ~plain.truncated).sum() >= 2  # rows ended early and left the batch
    _close(compiled, plain)
    with model.disable_adapter():
        assert not torch.equal(_generate(model, tok, params, compile_decode=True).sampling_logprobs, compiled.sampling_logprobs)


def test_compiled_decode_with_per_head_norms(compiled_calls):
    torch.set_num_threads(1)
    tok, model = _model("qwen3")
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=12, ignore_eos=True)
    plain = _generate(model, tok, params, static_cache=False)
    compiled = _generate(model, tok, params, compile_decode=True)
    assert compiled_calls
    _close(compiled, plain)


def test_compiled_layer_rotates_each_query_once(compiled_calls):
    """The rotated queries come out of an op inductor cannot inline (compiled_decode.materialize): inlined into the
    attention's loop over keys, the rotation ran once per key (3.7x the eager step's time on config B's model)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    torch.set_num_threads(1)
    tok, model = _model("llama")
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=4, ignore_eos=True)
    with inductor_config.patch(fx_graph_cache=False):  # the code of this compile, not one read back from the cache
        _, codes = run_and_get_code(lambda: _generate(model, tok, params, compile_decode=True))
    assert compiled_calls and codes
    assert all(code.count("torch.ops.rlvr.decode_materialize.default(") == 1 for code in codes)


def test_compiled_decode_under_bf16_autocast_follows_the_eager_step(monkeypatch, compiled_calls):
    """bf16 products run packed on CPUs with fast bf16 (elsewhere the step stays eager): forced here, so any CPU
    with oneDNN's bf16 kernels runs them. Same products as the eager step; the fused elementwise work rounds
    differently in bf16, so logits agree to bf16's rounding, compared on the same tokens step by step. A CPU
    without those kernels (AVX2 only) packs nothing in bf16: there the compiled engine runs the eager step, with the
    compiled engine's KV layout (bf16's rounding apart from the eager engine's)."""
    kernels = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: kernels)
    torch.set_num_threads(1)
    tok, model = _model("llama-gqa")
    prompts = [render_prompt(q, tok) for q in QUESTIONS]
    G, T = 3, 8
    engine = HFEngine(model, tok, compile_decode=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        layout = choose_layout(model, G, static=True, shared_prefix=True, lean=True, compiled=engine.compiled)
        eager_layout = choose_layout(model, G, static=True, shared_prefix=True, lean=True)
        with generation_mode(model, layout.attention):
            pre = prefill(model, tok, prompts, G)
            eager_pre = prefill(model, tok, prompts, G)
            step, eager = start_decode(model, pre, layout, G, T), start_decode(model, eager_pre, eager_layout, G, T)
            pos = pre.prompt_mask.sum(-1).repeat_interleave(G, 0)
            token, rows = pre.logits.argmax(-1), torch.arange(pos.shape[0])
            for t in range(T - 1):
                logits, expected = step.step(token, pos + t, rows), eager.step(token, pos + t, rows)
                assert logits.dtype == expected.dtype == torch.bfloat16 and torch.isfinite(logits).all()  # the lm_head's bf16
                torch.testing.assert_close(logits, expected, rtol=0, atol=0.05 * float(expected.abs().max()))
                token = expected.argmax(-1)
    assert len(compiled_calls) == (T - 1) * model.config.num_hidden_layers * kernels


def test_rollout_compile_reaches_the_hf_engine_and_is_checked():
    tok, model = _model("llama")
    on = load_config(None, ["rollout.compile=on"])
    assert make_engine("hf", model, tok, on).compiled is not None
    assert make_engine("hf", model, tok, load_config(None, [])).compiled is None
    with pytest.raises(ConfigError, match=r"`rollout.compile` must be one of \['off', 'on'\]"):
        check_config(load_config(None, ["rollout.compile=yes please"]))
    with pytest.raises(ConfigError, match="vLLM compiles its own: set rollout.compile=off"):
        check_config(load_config(None, ["rollout.compile=on", "rollout.engine=vllm"]))
