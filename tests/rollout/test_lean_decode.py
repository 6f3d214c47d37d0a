"""The lean decode step (rlvr.rollout.engines.hf.lean_decode) against the plain path: transformers' own forward
with a concatenating DynamicCache. Same tokens, and log-probs and entropies to 1e-5 in fp32, for
Llama (multi-head and grouped-query), Qwen2 (projection biases) and Qwen3 (per-head q/k norms),
in both KV layouts (prompt repeated per row / read once per group, its attention as explicit products or through the
flash kernel), with left padding of several
widths, rows finishing early and leaving the batch, greedy and sampled, and a LoRA-wrapped model."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

import rlvr.rollout.engines.hf.episode_cache as episode_cache
import rlvr.rollout.engines.hf.episode_decode as episode_decode
import rlvr.rollout.engines.hf.forward as forward
import rlvr.rollout.engines.hf.lean_decode as lean_decode
import rlvr.models.native_norm as native_norm
import rlvr.rollout.engines.hf.steps as steps
from rlvr.rollout.engines.hf import kv_buffers, native_rotary
from rlvr.data import render_prompt
from rlvr.models import native_build, native_linear
from rlvr.models.tokenizer import build_char_tokenizer
from rlvr.rollout import SamplingParams
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.engines.hf.compiled_decode import LoraProduct, Product
from rlvr.rollout.engines.hf.decode_attention import AttentionWay
from rlvr.rollout.engines.hf.lean_decode import LeanDecoder, lean_decoder_for

QUESTIONS = ["12+34=", "7-5=", "a much longer prompt than the others, long enough to share: 99+99="]


def _model(kind: str):
    tok = build_char_tokenizer()
    common = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        attn_implementation="sdpa",
    )
    torch.manual_seed(11)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_key_value_heads=4, **common))
    elif kind == "llama-gqa":
        model = LlamaForCausalLM(LlamaConfig(num_key_value_heads=2, **common))
    elif kind == "qwen2":  # q/k/v projections with bias
        model = Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=2, use_sliding_window=False, **common))
    else:  # qwen3: RMSNorm on each head's q and k
        model = Qwen3ForCausalLM(Qwen3Config(num_key_value_heads=2, head_dim=8, use_sliding_window=False, **common))
    with torch.no_grad():  # random weights near 0 give near-uniform samples: sharpen them so EOS comes early
        model.lm_head.weight.mul_(8)
    return tok, model.eval()


def with_lora(model, targets: list[str]):
    """The model under peft LoRA adapters on `targets`, non-zero, so that ignoring them would change the samples."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model


def _generate(model, tok, params, **engine):
    prompts = [render_prompt(q, tok) for q in QUESTIONS]
    return HFEngine(model, tok, **engine).generate(prompts, params, seeds=[4, 5, 6])


def _same(lean, plain):
    assert torch.equal(lean.completion_ids, plain.completion_ids) and torch.equal(lean.completion_mask, plain.completion_mask)
    torch.testing.assert_close(lean.sampling_logprobs, plain.sampling_logprobs, rtol=0, atol=1e-5)
    if plain.sampling_entropy is not None:
        torch.testing.assert_close(lean.sampling_entropy, plain.sampling_entropy, rtol=0, atol=1e-5)


@pytest.fixture
def count_lean_steps(monkeypatch):
    calls = []
    step = LeanDecoder.step
    way = lambda st: (st.prefix_keys is not None, st.flash, st.native, st.native_prefix)  # noqa: E731
    monkeypatch.setattr(LeanDecoder, "step", lambda self, *a: calls.append(way(a[2])) or step(self, *a))
    return calls


LAYOUTS = ["repeated", "shared", "shared-flash", "repeated-native", "shared-native", "shared-flash-native", "shared-native-prefix"]


def _way(layout: str, dtype: torch.dtype) -> AttentionWay:
    """The way `layout` names ("native": the rows' own slots through the C kernel; "prefix": the shared prompt's part
    through native_prefix's kernel too), in buffers of `dtype`."""
    return AttentionWay(dtype, "flash" in layout, layout.startswith("shared"), "native" in layout, "prefix" in layout)


@pytest.mark.parametrize("kind", ["llama", "llama-gqa", "qwen2", "qwen3"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "ignore_eos, drop, temperature",
    [(True, 0.0, 1.0), (False, 0.01, 1.0), (False, 0.25, 0.0)],
    ids=["fixed", "eos-drop-finished", "greedy"],
)
def test_lean_decode_same_as_plain_path(kind, layout, ignore_eos, drop, temperature, monkeypatch, count_lean_steps):
    torch.set_num_threads(1)
    tok, model = _model(kind)
    monkeypatch.setattr(steps, "SHARED_PREFIX_MIN_PROMPT", 10**6 if layout.startswith("repeated") else 0)
    # the fp32 buffers' way, through the flash kernel or the C kernel or not: not what this machine measures
    monkeypatch.setattr(lean_decode, "decode_attention_way", lambda *a, **kw: _way(layout, a[7]))
    params = SamplingParams(n=6, temperature=temperature, max_new_tokens=20, ignore_eos=ignore_eos)
    plain = _generate(model, tok, params, static_cache=False, drop_finished_fraction=drop)
    assert not count_lean_steps
    lean = _generate(model, tok, params, drop_finished_fraction=drop)
    way = _way(layout, torch.float32)
    assert count_lean_steps and set(count_lean_steps) == {(way.shared, way.flash, way.native, way.native_prefix)}  # in the way asked
    assert (plain.prompt_mask == 0).any()  # left padding of different widths
    if not ignore_eos and temperature > 0:
        assert ((plain.completion_mask.sum(-1) < 20) & ~plain.truncated).sum() >= 2  # rows ended early (and left the batch: drop 0.01)
    _same(lean, plain)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("grow", [0, 3])
def test_kv_buffers_grown_and_read_whole_same_as_plain_path(kind, layout, grow, monkeypatch):
    """Whole buffers (kv_buffers.GROW slots at a time, the unwritten ones masked) and buffers of every slot read
    sliced (GROW 0) both draw the plain path's tokens; the buffers hold exactly the slots grown so far (all of them
    from the start where the C kernel reads the rows' own slots)."""
    torch.set_num_threads(1)
    tok, model = _model(kind)
    monkeypatch.setattr(steps, "SHARED_PREFIX_MIN_PROMPT", 10**6 if layout.startswith("repeated") else 0)
    monkeypatch.setattr(lean_decode, "decode_attention_way", lambda *a, **kw: _way(layout, a[7]))
    monkeypatch.setattr(kv_buffers, "GROW", grow)
    lengths = []  # (slots written before the step, the buffers' slots in the step's attention)
    attention_args = lean_decode.DecodeState.attention_args

    def recording(st, i, scale):
        lengths.append((st.written, st.own_keys[i].shape[2]))
        return attention_args(st, i, scale)

    monkeypatch.setattr(lean_decode.DecodeState, "attention_args", recording)
    params = SamplingParams(n=6, temperature=1.0, max_new_tokens=20, ignore_eos=False)
    plain = _generate(model, tok, params, static_cache=False, drop_finished_fraction=0.01)
    lean = _generate(model, tok, params, drop_finished_fraction=0.01)
    _same(lean, plain)
    base = lengths[0][0]  # the prompt's slots (repeated layout), else 0
    assert base == (lean.prompt_ids.shape[1] if layout.startswith("repeated") else 0)
    grown = grow if "native" not in layout else 0  # the C kernel reads slots 0..t alone: every slot from the start
    for written, slots in lengths:
        own = written - base + 1  # the rows' own slots this step reads
        assert slots - base == (20 if grown == 0 else min(20, -(-own // grown) * grown)), (written, slots)
    assert len({slots for _, slots in lengths}) == (1 if grown == 0 else 7)  # 3, 6, ..., 18, 20 own slots


@pytest.mark.parametrize("kind", ["llama", "llama-gqa"])
@pytest.mark.parametrize("layout", ["repeated", "shared", "repeated-native", "shared-native", "shared-native-prefix"])
def test_bf16_buffers_under_bf16_autocast(kind, layout, monkeypatch):
    """Under bf16 autocast the decode keeps its KV buffers in fp32 or, where this machine timed it faster, in bf16
    (decode_attention.decode_attention_way, asked with lower=bf16 only here). Each step's log-probs stay as close to
    the float64 model's (its lean decode in float64, at the steps whose tokens so far are the same in all three greedy
    decodes) with bf16 buffers as with fp32 ones, within 1e-2 more: autocast's bf16 products are the larger rounding.
    So too through the C kernels (native: fp32 and bf16 buffers; the float64 decode runs the products)."""
    torch.set_num_threads(1)
    tok, model = _model(kind)
    monkeypatch.setattr(steps, "SHARED_PREFIX_MIN_PROMPT", 10**6 if layout.startswith("repeated") else 0)
    asked, buffers, logits = [], [], []
    attention_args, step = lean_decode.DecodeState.attention_args, LeanDecoder.step
    recording = lambda st, i, sc: buffers.append((st.own_keys[i].dtype, st.native)) or attention_args(st, i, sc)  # noqa: E731
    monkeypatch.setattr(lean_decode.DecodeState, "attention_args", recording)
    monkeypatch.setattr(LeanDecoder, "step", lambda self, *a: logits.append(step(self, *a).log_softmax(-1)) or logits[-1])
    params = SamplingParams(n=4, temperature=0.0, max_new_tokens=12, ignore_eos=True)
    runs = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        way = _way(layout if dtype != torch.float64 else layout.split("-native")[0], dtype)
        choosing = lambda *a, way=way, **kw: asked.append((a[7], kw["lower"], kw["shared"])) or way  # noqa: E731
        monkeypatch.setattr(lean_decode, "decode_attention_way", choosing)
        buffers.clear()
        logits.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype != torch.float64):
            runs[dtype] = (_generate(model.to(torch.float64 if dtype == torch.float64 else torch.float32), tok, params), torch.cat(logits))
        assert set(buffers) == {(dtype, way.native)}
    asks = None if layout.startswith("shared") else False  # short prompts: the shared layout's choice is timed against the repeated one
    assert asked[:2] == [(torch.float32, torch.bfloat16, asks)] * 2  # fp32 is the step's dtype, bf16 the lower one
    assert asked[2] == (torch.float64, None, asks)
    tokens = {dtype: gen.completion_ids for dtype, (gen, _) in runs.items()}
    # the lean steps' log-probs [rows, 11 steps, V]: step s reads tokens 0..s (token 0 is the prefill's) and draws s + 1
    logp = {dtype: lp.view(11, -1, lp.shape[-1]).transpose(0, 1) for dtype, (_, lp) in runs.items()}
    # compared at the steps whose inputs are the same in all three (a greedy near-tie may pick another token)
    differs = (tokens[torch.float32] != tokens[torch.float64]) | (tokens[torch.bfloat16] != tokens[torch.float64])
    same_inputs = (differs.cumsum(-1) == 0)[:, :11]  # [rows, steps]
    assert same_inputs.float().mean() > 0.5
    errors = {
        d: float((logp[d][same_inputs].double() - logp[torch.float64][same_inputs]).abs().max()) for d in (torch.float32, torch.bfloat16)
    }
    assert 0 < errors[torch.float32] < 0.1 and errors[torch.bfloat16] < errors[torch.float32] + 1e-2, errors
    bf16_logp, fp32_logp = logp[torch.bfloat16][same_inputs], logp[torch.float32][same_inputs]
    assert not torch.equal(bf16_logp, fp32_logp)


def test_lean_decode_with_lora_adapters(count_lean_steps):
    """peft wraps the projections: the lean step calls them as modules, so the adapters apply."""
    torch.set_num_threads(1)
    tok, model = _model("llama-gqa")
    model = with_lora(model, ["q_proj", "v_proj", "gate_proj"])
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=16)
    plain = _generate(model, tok, params, static_cache=False)
    lean = _generate(model, tok, params)
    assert count_lean_steps
    _same(lean, plain)
    with model.disable_adapter():
        assert not torch.equal(_generate(model, tok, params).sampling_logprobs, lean.sampling_logprobs)


def test_lean_decode_only_for_architectures_it_reproduces():
    from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM

    _, llama = _model("llama")
    assert isinstance(lean_decoder_for(llama), LeanDecoder)
    small = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    assert lean_decoder_for(Gemma2ForCausalLM(Gemma2Config(head_dim=8, **small))) is None  # extra norms, soft-capping
    assert lean_decoder_for(MistralForCausalLM(MistralConfig(sliding_window=8, attn_implementation="sdpa", **small))) is None
    assert lean_decoder_for(LlamaForCausalLM(LlamaConfig(attn_implementation="eager", **small))) is None


@pytest.fixture
def bf16_kernels(monkeypatch) -> bool:
    """Whether oneDNN has bf16 kernels here; where it has, the packing region packs bf16 weights whether this CPU's bf16
    is fast or emulated (where it has not, nothing packs in bf16 and nothing fuses)."""
    import rlvr.models.packed_linears as packed_linears
    import rlvr.rollout.engines.hf.layer_products as layer_products

    kernels = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    monkeypatch.setattr(layer_products, "bf16_packs", lambda: kernels)
    monkeypatch.setattr(packed_linears, "bf16_packs", lambda: kernels)
    return kernels


def _flat(products):
    return [m for p in products for m in (*p.qkv, p.o, *p.gate_up, p.down)]


@pytest.mark.parametrize("kind", ["llama", "llama-gqa", "qwen2", "qwen3"])
def test_fused_products_give_the_separate_products_bits(kind, bf16_kernels, monkeypatch):
    """Under bf16 autocast with packed bf16 weights, q/k/v and gate/up run as one product each (layer_products.py):
    the same tokens and bit-for-bit the same log-probs and entropies as every projection apart, which are the modules'
    calls; in fp32 nothing is fused, nor for a model without grouped-query attention (llama: 4 kv heads for 4 q heads),
    where fusing did not pay. Where oneDNN has no bf16 kernels nothing packs, so nothing fuses either."""
    import rlvr.rollout.engines.hf.layer_products as layer_products

    kernels = bf16_kernels
    tok, model = _model(kind)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=20, ignore_eos=True)
    seen: list = []
    products_for = layer_products.products_for
    monkeypatch.setattr(lean_decode, "products_for", lambda *a: seen.append(products_for(*a)) or seen[-1])
    runs = {}
    for fuse in (True, False):
        monkeypatch.setattr(layer_products, "FUSE", fuse)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            runs[fuse] = _generate(model, tok, params)
    assert all(len(p.qkv) == 1 and len(p.gate_up) == 1 for p in seen[0][:-1]) == (kernels and kind != "llama")  # q/k/v and gate/up fused
    assert all(len(p.qkv) == 3 and len(p.gate_up) == 2 for p in seen[-1][:-1])  # FUSE off: apart
    assert torch.equal(runs[True].completion_ids, runs[False].completion_ids)
    assert torch.equal(runs[True].sampling_logprobs, runs[False].sampling_logprobs)
    assert torch.equal(runs[True].sampling_entropy, runs[False].sampling_entropy)
    seen.clear()
    _generate(model, tok, params)  # fp32: apart
    assert seen and all(len(p.qkv) == 3 for products in seen for p in products[:-1])


def test_fused_products_follow_every_weight_update(bf16_kernels, monkeypatch):
    """The fused weights are packed again whenever a weight changed: after an optimizer step (in place) and after a load
    (copy_) the fused step samples bit for bit as the separate products do with the new weights."""
    import rlvr.models.packed_linears as packed_linears
    import rlvr.rollout.engines.hf.layer_products as layer_products

    kernels = bf16_kernels
    tok, model = _model("llama-gqa")
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=16, ignore_eos=True)
    fused = []
    fused_decode_weight = packed_linears.fused_decode_weight
    monkeypatch.setattr(layer_products, "fused_decode_weight", lambda *a: fused.append(fused_decode_weight(*a)) or fused[-1])

    def both():
        out = {}
        for fuse in (True, False):
            monkeypatch.setattr(layer_products, "FUSE", fuse)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out[fuse] = _generate(model, tok, params)
        assert fused and all((w is not None) == kernels for w in fused)
        fused.clear()
        assert torch.equal(out[True].completion_ids, out[False].completion_ids)
        assert torch.equal(out[True].sampling_logprobs, out[False].sampling_logprobs)
        return out[True]

    first = both()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    ids = torch.tensor([[5, 6, 7, 8]])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    after = both()
    assert not torch.equal(after.sampling_logprobs, first.sampling_logprobs)
    layer = model.model.layers[0]
    with torch.no_grad():  # a load (copy_) is an update too
        layer.mlp.up_proj.weight.copy_(torch.randn_like(layer.mlp.up_proj.weight))
    assert not torch.equal(both().sampling_logprobs, after.sampling_logprobs)


class _AnswerOnce:
    """A turn driver: each row's first turn (ended by a stop string or EOS) is answered with a few external tokens
    (different per row), then the row's next turn ends the episode."""

    def __init__(self, tok, stop_strings):
        self.tok, self.stop_strings, self.turns, self.pending = tok, stop_strings, {}, {}

    def end_turn(self, row, turn_ids, eos):
        self.turns[row] = self.turns.get(row, 0) + 1
        if self.turns[row] > 1:
            return False
        self.pending[row] = self.tok(f"<{row % 3}{'x' * (row % 4)}>", add_special_tokens=False)["input_ids"]
        return True

    def ready(self, block):
        out, self.pending = self.pending, {}
        return out


@pytest.mark.parametrize("kind", ["llama", "llama-gqa", "qwen2", "qwen3", "llama-gqa-lora"])
@pytest.mark.parametrize("temperature, autocast", [(1.0, False), (0.0, False), (1.0, True)], ids=["sampled", "greedy", "bf16"])
@pytest.mark.parametrize("layout", ["repeated", "repeated-native", "shared"])
def test_lean_episode_steps_same_as_the_models_forward(kind, temperature, autocast, layout, monkeypatch):
    """Multi-turn episodes (rows at lengths of their own, external tokens fed between turns) through the lean step
    and through the model's own forward on the same episode cache (the one-token steps and the chunks of external tokens):
    the same tokens, log-probs to 1e-5 (also under bf16 autocast, with the KV buffers the engine keeps there), also with
    LoRA adapters; each row's buffers beginning with its prompt (its one-token steps through the torch products, or
    the C kernels: episode_cache.native_step), or the prompt once per group."""
    torch.set_num_threads(1)
    monkeypatch.setattr(episode_decode, "PROMPT_PER_ROW", layout.startswith("repeated"))  # the CPU's layout, or other devices'
    native = layout == "repeated-native"
    way = lambda *a, **kw: AttentionWay(a[7], False, False, native)  # noqa: E731  (a[7]: the buffers' dtype)
    monkeypatch.setattr(episode_decode, "decode_attention_way", way)
    native_steps = []
    step_native = lean_decode.native_step
    monkeypatch.setattr(lean_decode, "native_step", lambda *a: native_steps.append(1) or step_native(*a))
    # the kernel's chunks sum in another order than the forward's products: under bf16 autocast the next product's
    # rounding of that makes log-probs 1e-2 apart (test_native_chunks_against_the_explicit_products has them)
    monkeypatch.setattr(episode_cache, "NATIVE_CHUNKS", not autocast)
    tok, model = _model(kind.removesuffix("-lora"))
    if kind.endswith("-lora"):  # peft wraps the projections: the lean step calls them as modules, chunks too
        model = with_lora(model, ["q_proj", "k_proj", "up_proj"])  # (these adapters' greedy turns reach the stop strings)
    calls = []
    step = LeanDecoder.step_episode
    repeated = []  # whether each lean step's cache held the prompt at the head of each row's buffers
    monkeypatch.setattr(
        LeanDecoder,
        "step_episode",
        lambda self, *a, **k: (
            calls.append((tuple(a[0].shape), k.get("keep")))  # keep: a ragged forward's rows
            or repeated.append(a[2].prompt_slots > 0)
            or step(self, *a, **k)
        ),
    )
    prompts = [render_prompt(q, tok) for q in QUESTIONS]
    params = SamplingParams(n=4, temperature=temperature, max_new_tokens=24)
    runs = {}
    for lean in (False, True):
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            engine = HFEngine(model, tok, lean=lean)
            runs[lean] = engine.generate_episodes(prompts, params, [4, 5, 6], _AnswerOnce(tok, ["1", "5", "O", "g"]))
        assert bool(calls) == lean
    (p_ids, p_mask, plain), (l_ids, l_mask, lean_traces) = runs[False], runs[True]
    assert torch.equal(p_ids, l_ids) and torch.equal(p_mask, l_mask) and (p_mask == 0).any()  # left padding
    assert sum(0 in t.loss for t in plain) >= 2  # external tokens fed mid-episode
    steps = {shape[0] for shape, keep in calls if len(shape) == 1 and keep is None}
    assert len(steps) > 1  # steps with some rows out of the forward (a row ended or waited)
    # the external tokens went in as chunks through the lean step too: right-padded [n, K], or (every forward reading
    # each token's slots alone: the native layout without autocast) side by side with a step's sampled tokens
    assert any(len(shape) == 2 and shape[1] > 1 for shape, _ in calls) or (native and not autocast)
    ragged = [shape[0] > len(keep) for shape, keep in calls if keep is not None]
    assert all(ragged) and bool(ragged) == (native and not autocast)
    assert set(repeated) == {layout.startswith("repeated")}
    assert bool(native_steps) == native
    for a, b in zip(plain, lean_traces):
        assert a.ids == b.ids and a.loss == b.loss
        torch.testing.assert_close(torch.tensor(b.logps), torch.tensor(a.logps), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "llama-gqa", "qwen3"])
@pytest.mark.parametrize("buffers", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["repeated", "shared"])
def test_episode_steps_through_the_c_passes_give_torchs_bits(kind, buffers, layout, monkeypatch):
    """The lean episode steps' C passes against their torch ways: q and k rotated and k and v written in one pass
    (NATIVE_WRITES: the chunks of external tokens and the torch attention's steps; its padding not written), and the
    one-token steps' attention over the rows in the step alone, each read to its own length (NATIVE_STEP, the repeated
    layout) instead of over a mask built per step: the same tokens and the same log-probs, bit for bit, from fp32
    buffers and from bf16 ones (under bf16 autocast)."""
    torch.set_num_threads(1)
    tok, model = _model(kind)
    monkeypatch.setattr(episode_decode, "PROMPT_PER_ROW", layout == "repeated")
    monkeypatch.setattr(episode_decode, "decode_attention_way", lambda *a, **kw: AttentionWay(buffers, False, False, True))
    prompts = [render_prompt(q, tok) for q in QUESTIONS]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24)
    native_steps, c_writes, runs = [], [], {}
    step_native, write = lean_decode.native_step, native_rotary.rotate_and_write_at
    monkeypatch.setattr(lean_decode, "native_step", lambda *a: native_steps.append(1) or step_native(*a))
    monkeypatch.setattr(native_rotary, "rotate_and_write_at", lambda *a: c_writes.append(a[0].shape[0]) or write(*a))
    monkeypatch.setattr(episode_cache, "NATIVE_CHUNKS", False)  # chunks through the kernel sum in another order
    for flags in [(False, False), (False, True), (True, True)]:
        monkeypatch.setattr(episode_cache, "NATIVE_STEP", flags[0])
        monkeypatch.setattr(episode_cache, "NATIVE_WRITES", flags[1])
        native_steps.clear(), c_writes.clear()
        with torch.autocast("cpu", torch.bfloat16, enabled=buffers == torch.bfloat16):
            runs[flags] = HFEngine(model, tok).generate_episodes(prompts, params, [4, 5, 6], _AnswerOnce(tok, ["1", "5", "O", "g"]))[2]
        assert bool(native_steps) == (flags[0] and layout == "repeated") and bool(c_writes) == flags[1]
    assert sum(0 in t.loss for t in runs[False, False]) >= 2  # external tokens fed mid-episode
    for flags in [(False, True), (True, True)]:
        for a, b in zip(runs[False, False], runs[flags]):
            assert a.ids == b.ids and a.loss == b.loss and a.logps == b.logps, flags


@pytest.mark.parametrize("buffers", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_native_chunks_against_the_explicit_products(buffers, monkeypatch):
    """A tool result's chunk through the C kernel (NATIVE_CHUNKS: each token a query of its own, read to its own slot)
    against the explicit products over the rows' copies: the same math in another order. fp32: the same tokens, log-probs
    to 1e-5; under bf16 autocast the products after attention round that apart: the same tokens in most rows, their
    log-probs within 2e-2."""
    torch.set_num_threads(1)
    tok, model = _model("llama-gqa")
    monkeypatch.setattr(episode_decode, "PROMPT_PER_ROW", True)
    monkeypatch.setattr(episode_decode, "decode_attention_way", lambda *a, **kw: AttentionWay(buffers, False, False, True))
    prompts = [render_prompt(q, tok) for q in QUESTIONS]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24)
    chunk_calls, runs = [], {}
    step_native = lean_decode.native_step
    monkeypatch.setattr(
        lean_decode, "native_step", lambda *a: (len(a[6].query_rows) > len(a[6].rows) and chunk_calls.append(1)) or step_native(*a)
    )
    for on in (False, True):
        monkeypatch.setattr(episode_cache, "NATIVE_CHUNKS", on)
        chunk_calls.clear()
        with torch.autocast("cpu", torch.bfloat16, enabled=buffers == torch.bfloat16):
            runs[on] = HFEngine(model, tok).generate_episodes(prompts, params, [4, 5, 6], _AnswerOnce(tok, ["1", "5", "O", "g"]))[2]
        assert bool(chunk_calls) == on
    same = [(a, b) for a, b in zip(runs[False], runs[True]) if a.ids == b.ids and a.loss == b.loss]
    assert sum(0 in a.loss for a, _ in same) >= 2  # rows with external tokens among them
    if buffers == torch.float32:
        assert len(same) == len(runs[False])
    assert len(same) >= len(runs[False]) * 3 // 4
    errors = [abs(x - y) for a, b in same for x, y in zip(a.logps, b.logps)]
    assert max(errors) < (1e-5 if buffers == torch.float32 else 2e-2), max(errors)


def test_episodes_keep_bf16_buffers_where_timed_faster(monkeypatch):
    """Under bf16 autocast the episodes' KV buffers (on the CPU each row's, beginning with its prompt) are fp32 or,
    where this machine timed the repeated layout's decode attention faster so (decode_attention_way, asked with the
    prefill's shapes, lower=bf16), bf16: keys and values round to bf16, the scores and softmax stay fp32. Sampled
    episodes (the same seeds) with bf16 buffers then mostly take the same tokens as with fp32 ones, their log-probs
    within 2e-2 (autocast's bf16 products are the larger rounding), not equal."""
    torch.set_num_threads(1)
    tok, model = _model("llama-gqa")
    prompts = [render_prompt(q, tok) for q in QUESTIONS]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24)
    asked, buffers, runs = [], set(), {}
    prepare = episode_decode.EpisodeState.prepare
    recording = lambda st, *a: buffers.add(st.cache.layers[0].kbuf.dtype) or prepare(st, *a)  # noqa: E731
    monkeypatch.setattr(episode_decode.EpisodeState, "prepare", recording)
    for dtype in (torch.float32, torch.bfloat16):
        way = AttentionWay(dtype, False, False)
        choosing = lambda *a, way=way, **kw: asked.append((a, kw)) or way  # noqa: E731
        monkeypatch.setattr(episode_decode, "decode_attention_way", choosing)
        buffers.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            runs[dtype] = HFEngine(model, tok).generate_episodes(prompts, params, [4, 5, 6], _AnswerOnce(tok, ["1", "5", "O", "g"]))[2]
        assert buffers == {dtype}
    # the shapes asked: 3 prompts x 4, 4 heads over 2 kv heads of 8, the padded prompt's length, 24 new tokens
    P = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    (args, kw), layers = asked[0], len(model.model.layers)
    assert args == (3, 4, 4, 2, 8, P, 24, torch.float32)
    # the episodes run the products, or their one-token steps through the C kernel: not the flash kernel
    assert kw == dict(shared=False, lower=torch.bfloat16, layers=layers, repeated_flash=False, native=True)
    assert len(asked) == 2
    fp32, bf16 = runs[torch.float32], runs[torch.bfloat16]
    same = [(a, b) for a, b in zip(fp32, bf16) if a.ids == b.ids]
    assert len(same) >= len(fp32) // 2 and sum(0 in a.loss for a, _ in same) >= 1  # some with tool results among them
    errors = [abs(x - y) for a, b in same for x, y in zip(a.logps, b.logps)]
    assert 0 < max(errors) < 2e-2, max(errors)


@pytest.mark.parametrize("way", ["onednn", "native", "plain"])
def test_direct_products_are_the_module_calls_bit_for_bit(way, monkeypatch):
    """The step runs each projection directly from the weight its module's call in the packing region uses
    (compiled_decode.Product): the same bits as that call, packed or plain; outside a region, the module itself; the
    table follows the rows bucket."""
    import rlvr.models.packed_linears as packed_linears

    tok = build_char_tokenizer()
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4)
    model = LlamaForCausalLM(cfg).eval()
    if way == "native" and not native_linear.available():
        pytest.fail(f"the native linear kernel did not build here: {native_build.why_not(native_linear.SOURCE)}")

    def measured(i, o, rows):  # the machine's choice, each way (oneDNN's never below FP32_MIN_WEIGHT)
        small = i * min(o if isinstance(o, tuple) else (o,)) < packed_linears.FP32_MIN_WEIGHT
        return "plain" if small and way == "onednn" else way

    monkeypatch.setattr(packed_linears, "fp32_way", measured)
    decoder = lean_decoder_for(model)
    assert decoder is not None
    x = torch.randn(24, 256)

    with torch.no_grad():
        outside = decoder._products(24, x.device)
        assert outside[0].qkv[0] is model.model.layers[0].self_attn.q_proj  # no region: the module
        with packed_linears.packed_linears_in(model):
            decoder._direct = {}
            products = decoder._products(24, x.device)
            assert all(type(p) is Product and p.way == way for p in _flat(products[:2]))
            # one kv head per q head: only the native kernel's products fuse (each output its own bits)
            assert all((len(p.qkv), len(p.gate_up)) == ((1, 1) if way == "native" else (3, 2)) for p in products[:2])
            lm_way = "plain" if way == "onednn" else way  # the lm_head (~100 x 256): too small for oneDNN's
            assert type(products[-1]) is Product and products[-1].way == lm_way
            for i, layer in enumerate(model.model.layers):
                attn, mlp = layer.self_attn, layer.mlp
                for p, ms in zip(
                    (products[i].qkv, (products[i].o,), products[i].gate_up),
                    ((attn.q_proj, attn.k_proj, attn.v_proj), (attn.o_proj,), (mlp.gate_proj, mlp.up_proj)),
                ):
                    got = torch.cat([lean_decode._product(part, x) for part in p], -1)
                    assert torch.equal(got, torch.cat([m(x) for m in ms], -1)), (i, ms)
            assert torch.equal(lean_decode._product(products[-1], x), model.lm_head(x))
            assert decoder._products(17, x.device) is products  # the same rows bucket (32): the same table
            assert decoder._products(300, x.device) is not products  # past the packing region's rows: modules
            assert decoder._products(300, x.device)[0].qkv[0] is model.model.layers[0].self_attn.q_proj


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_lora_products_are_peft_calls_bit_for_bit(autocast):
    """A peft LoRA projection runs as its three products (compiled_decode.LoraProduct) from the weights its Linears
    use in the packing region: the same bits as peft's forward there; a projection without an adapter stays a
    Product, and with adapter dropout in training mode the module is called as it is. Under bf16 autocast on a CPU
    whose bf16 is emulated the region packs nothing: every projection is its module, called as it is."""
    import rlvr.models.packed_linears as packed_linears

    direct = not autocast or packed_linears.bf16_packs()
    tok = build_char_tokenizer()
    torch.manual_seed(4)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4)
    model = with_lora(LlamaForCausalLM(cfg), ["q_proj", "down_proj"]).eval()
    decoder = lean_decoder_for(model)
    assert decoder is not None
    x = torch.randn(24, 256)
    h = torch.randn(24, 512)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), packed_linears.packed_linears_in(model):
        products = decoder._products(24, x.device)
        for i, layer in enumerate(model.base_model.model.model.layers):
            q, k, down = products[i].qkv[0], products[i].qkv[1], products[i].down  # q has an adapter: q/k/v apart
            if direct:
                assert type(q) is LoraProduct and type(down) is LoraProduct and type(k) is Product
            else:
                assert q is layer.self_attn.q_proj and down is layer.mlp.down_proj and k is layer.self_attn.k_proj
            assert torch.equal(lean_decode._product(q, x), layer.self_attn.q_proj(x)), i
            assert torch.equal(lean_decode._product(down, h), layer.mlp.down_proj(h)), i
    model.train()  # peft's adapter dropout would act: the module, not the products
    layer = model.base_model.model.model.layers[0]
    layer.self_attn.q_proj.lora_dropout["default"] = torch.nn.Dropout(0.1)
    with torch.no_grad(), packed_linears.packed_linears_in(model):
        decoder._direct = {}
        assert decoder._products(24, x.device)[0].qkv[0] is layer.self_attn.q_proj


def test_products_reading_one_input_cast_it_once():
    """q, k and v (gate and up) read the same normed x: with a shared `casts` it is cast to the products' bf16 once for
    all of them (a LoRA projection's base and A included), to exactly the values each product's own cast gives; a
    product in x's own dtype reads x itself."""
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(5)
    x = torch.randn(24, 64)
    bf16 = lambda rows, cols: Product(torch.randn(rows, cols).bfloat16(), None, rows, False)  # noqa: E731
    lora = LoraProduct(bf16(32, 64), bf16(4, 64), bf16(32, 4), 2.0)
    products = [lora, bf16(16, 64), bf16(16, 64), Product(torch.randn(8, 64), None, 8, False)]

    class CastsOfX(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0] is x:
                CastsOfX.count += 1
            return func(*args, **(kwargs or {}))

    with CastsOfX():
        separate = [lean_decode._product(p, x) for p in products]
    per_product, CastsOfX.count = CastsOfX.count, 0
    casts: dict = {}
    with CastsOfX():
        shared = [lean_decode._product(p, x, casts) for p in products]
    assert (per_product, CastsOfX.count) == (4, 1)  # LoRA's base and A, k, v: four casts; shared: one
    assert [o.dtype for o in shared] == [torch.bfloat16] * 3 + [torch.float32]
    assert all(torch.equal(a, b) for a, b in zip(separate, shared))
    assert casts[torch.float32] is x


@pytest.mark.parametrize("way", ["explicit", "flash", "native-prefix"])
def test_compaction_drops_finished_groups_from_the_prompt_part(way):
    """Shared layout: when every row of a group has finished, compaction (DecodeState.select) drops the group's prompt
    keys/values and padding bias too, and renumbers the rows left to their places among the groups left, so the prompt
    part runs over the groups still decoding only; the rows left attend exactly as before (through the C kernels too,
    the prompt's keys transposed for native_prefix's)."""
    from rlvr.rollout.engines.hf.decode_attention import decode_attention
    from rlvr.rollout.engines.hf.native_prefix import transposed_keys

    torch.manual_seed(6)
    B, G, Hq, Hkv, D, P, S, t = 3, 2, 4, 2, 8, 5, 6, 3
    bias = torch.zeros(B, 1, 1, P)
    bias[1, ..., :2] = bias[2, ..., :1] = float("-inf")  # left padding of different widths
    own = [torch.randn(B * G, Hkv, S, D) for _ in range(2)]
    prefix = [torch.randn(B, Hkv, P, D) for _ in range(2)]
    native = way == "native-prefix"
    keys = [transposed_keys(prefix[0])] if native else prefix[:1]
    kw = dict(flash=way == "flash", native=native, native_prefix=native)
    state = lean_decode.DecodeState(own[:1], own[1:], bias, torch.arange(B * G), G, t, keys, prefix[1:], **kw)
    q, k, v = torch.randn(B * G, Hq, D), torch.randn(B * G, Hkv, D), torch.randn(B * G, Hkv, D)
    before = decode_attention(q, k, v, *state.attention_args(0, D**-0.5), **kw)  # [6, Hq x D]
    keep = torch.tensor([0, 1, 4])  # group 0 whole, none of group 1, one row of group 2
    state.select(keep)
    assert state.prefix_keys is not None and state.prefix_values is not None
    assert state.prefix_keys[0].shape[0] == state.prefix_values[0].shape[0] == len(state.bias) == 2
    assert torch.equal(state.prefix_keys[0], keys[0][[0, 2]]) and torch.equal(state.bias, bias[[0, 2]])
    assert state.rows.tolist() == [0, 1, 2]  # group 2's first row: the second group's first place now
    after = decode_attention(q[keep], k[keep], v[keep], *state.attention_args(0, D**-0.5), **kw)
    torch.testing.assert_close(after, before[keep], rtol=0, atol=1e-6)
    state.select(torch.tensor([2]))  # only group 2's row left: one group, every row of it
    assert len(state.bias) == 1 and state.rows.tolist() == [0]


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("shape", [(1, 32), (64, 32), (7, 3, 32), (64, 256), (5, 4, 8)])
def test_the_decode_norms_give_the_modules_bits(kind, shape):
    """_rms_norm (F.rms_norm for the plain norms, without the module call) against the RMSNorm modules' own forward,
    bit for bit: layer norms and qwen3's per-head q/k norms, at decode and odd shapes."""
    _, model = _model(kind)
    attn = model.model.layers[0].self_attn
    norms = [model.model.layers[0].input_layernorm, model.model.norm] + ([attn.q_norm] if kind == "qwen3" else [])
    torch.manual_seed(5)
    for norm in norms:
        if norm.weight.shape[0] != shape[-1]:
            norm = type(norm)(shape[-1], eps=norm.variance_epsilon)
        with torch.no_grad():
            norm.weight.normal_(1, 0.3)
            x = torch.randn(*shape) * 3
            got = native_norm.rms_norm(norm, x)
            assert torch.equal(got, norm(x))
            assert torch.equal(got, torch.nn.functional.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon))


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers"])
def test_decode_loops_run_in_inference_mode_and_hand_back_normal_tensors(lean, monkeypatch):
    """The decode loops run under torch.inference_mode (forward.decode_mode): the single-turn decode gives the tokens,
    log-probs and entropies of the loop under no_grad alone bit for bit, the multi-turn one the same traces; every
    step ran in inference mode, and what training reads (the Generation's tensors) are normal tensors a forward under
    autograd takes (an inference tensor saved for backward, as an embedding's ids are, raises)."""
    torch.set_num_threads(1)
    tok, model = _model("llama-gqa")
    modes = []
    step_class = LeanDecoder if lean else steps.TransformersStep
    for name in ("step", "step_episode") if lean else ("step",):
        step = getattr(step_class, name)
        monkeypatch.setattr(
            step_class, name, lambda self, *a, _s=step, **k: modes.append(torch.is_inference_mode_enabled()) or _s(self, *a, **k)
        )
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=16)
    runs = {}
    for on in (False, True):
        monkeypatch.setattr(forward, "INFERENCE_MODE", on)
        modes.clear()
        runs[on] = _generate(model, tok, params, lean=lean, static_cache=lean)
        assert modes and set(modes) == {on}
    off, on = runs[False], runs[True]
    assert torch.equal(on.completion_ids, off.completion_ids) and torch.equal(on.sampling_logprobs, off.sampling_logprobs)
    assert torch.equal(on.sampling_entropy, off.sampling_entropy)
    fields = [on.prompt_ids, on.prompt_mask, on.completion_ids, on.completion_mask, on.sampling_logprobs, on.sampling_entropy]
    assert not any(t.is_inference() for t in fields)
    model.zero_grad()
    model(torch.cat([on.prompt_ids, on.completion_ids], 1)).logits.logsumexp(-1).mean().backward()
    assert model.model.embed_tokens.weight.grad is not None
    if lean:  # multi-turn episodes: their traces are Python, the prompt ids made before the loop
        prompts = [render_prompt(q, tok) for q in QUESTIONS]
        traces = {}
        for on in (False, True):
            monkeypatch.setattr(forward, "INFERENCE_MODE", on)
            modes.clear()
            ids, mask, traces[on] = HFEngine(model, tok).generate_episodes(prompts, params, [4, 5, 6], _AnswerOnce(tok, ["1", "5"]))
            assert modes and set(modes) == {on} and not ids.is_inference() and not mask.is_inference()
        assert [(t.ids, t.loss, t.logps) for t in traces[True]] == [(t.ids, t.loss, t.logps) for t in traces[False]]


@pytest.mark.parametrize("kind", ["llama-gqa", "qwen3"])
@pytest.mark.parametrize("layout", ["repeated-native", "shared-native", "shared-native-prefix", "shared-flash", "repeated"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_native_rotation_and_write_give_torchs_bits(kind, layout, autocast, monkeypatch):
    """Whichever way the attention runs (the C kernels, the flash kernel, the explicit products), the rotation of q and
    k and the write of k and v run through one C pass (native_rotary.py): the same tokens, log-probs and entropies bit
    for bit as torch's rotate and copies, from fp32 products or autocast's bf16 ones (fused q/k/v where they fuse) into
    fp32 or bf16 buffers (fp32 ones for the flash kernel)."""
    import rlvr.rollout.engines.hf.native_rotary as native_rotary

    torch.set_num_threads(1)
    tok, model = _model(kind)
    monkeypatch.setattr(steps, "SHARED_PREFIX_MIN_PROMPT", 10**6 if layout.startswith("repeated") else 0)
    buffers = torch.bfloat16 if autocast and "flash" not in layout else torch.float32
    monkeypatch.setattr(lean_decode, "decode_attention_way", lambda *a, **kw: _way(layout, buffers))
    passes = []
    rotate_and_write = native_rotary.rotate_and_write
    monkeypatch.setattr(native_rotary, "rotate_and_write", lambda *a: passes.append(a[5].dtype) or rotate_and_write(*a))
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=16, ignore_eos=True)
    runs = {}
    for native in (True, False):
        monkeypatch.setattr(native_rotary, "available", lambda native=native: native)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            runs[native] = _generate(model, tok, params)
        assert bool(passes) == native and set(passes) <= {buffers}
        passes.clear()
    assert torch.equal(runs[True].completion_ids, runs[False].completion_ids)
    assert torch.equal(runs[True].sampling_logprobs, runs[False].sampling_logprobs)
    assert torch.equal(runs[True].sampling_entropy, runs[False].sampling_entropy)


@pytest.mark.parametrize("kind", ["llama", "llama-gqa", "qwen2", "qwen3"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_native_add_and_norm_give_torchs_bits(kind, autocast, monkeypatch):
    """The residual add, RMSNorm and bf16 cast of the eager CPU step as one C pass (native_norm.py): the same tokens,
    log-probs and entropies bit for bit as torch's three ops; every norm of the step goes through it (2 a layer and
    the final one), with the bf16 copy only under autocast."""
    torch.set_num_threads(1)
    tok, model = _model(kind)
    passes = []
    add_rms_norm = native_norm.add_rms_norm
    monkeypatch.setattr(native_norm, "add_rms_norm", lambda *a: passes.append(a[4]) or add_rms_norm(*a))
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=16, ignore_eos=True)
    runs = {}
    for native in (True, False):
        monkeypatch.setattr(native_norm, "ON", native)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            runs[native] = _generate(model, tok, params)
        assert (len(passes) == 15 * (2 * 2 + 1)) if native else not passes  # 15 steps after the prefill, 2 layers
        assert set(passes) <= {autocast}
        passes.clear()
    assert torch.equal(runs[True].completion_ids, runs[False].completion_ids)
    assert torch.equal(runs[True].sampling_logprobs, runs[False].sampling_logprobs)
    assert torch.equal(runs[True].sampling_entropy, runs[False].sampling_entropy)


@pytest.mark.parametrize("kind", ["llama", "llama-gqa", "qwen2", "qwen3"])
def test_native_swiglu_gives_torchs_bits(kind, monkeypatch):
    """Under bf16 autocast the eager CPU step's SwiGLU runs as one C pass (rlvr.models.native_swiglu; gate and up
    apart, or the halves of one fused product): the same tokens, log-probs and entropies bit for bit as torch's silu and
    mul, every layer of every step through it."""
    from rlvr.models import native_swiglu

    torch.set_num_threads(1)
    tok, model = _model(kind)
    passes = []
    forward = native_swiglu._forward
    monkeypatch.setattr(native_swiglu, "_forward", lambda *a: passes.append(a[0].dtype) or forward(*a))
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=16, ignore_eos=True)
    runs = {}
    for native in (True, False):
        monkeypatch.setattr(native_swiglu, "ON", native)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            runs[native] = _generate(model, tok, params)
        assert (len(passes) == 15 * 2 and set(passes) == {torch.bfloat16}) if native else not passes  # 15 steps, 2 layers
        passes.clear()
    assert torch.equal(runs[True].completion_ids, runs[False].completion_ids)
    assert torch.equal(runs[True].sampling_logprobs, runs[False].sampling_logprobs)
    assert torch.equal(runs[True].sampling_entropy, runs[False].sampling_entropy)
