"""The decode step of Llama-family models without transformers' per-token machinery.

transformers' forward is general: per token it builds masks, dispatches attention through
registries, updates a cache object layer by layer, wraps outputs in dataclasses. For one new token
per row that Python work is a large share of the hf engine's decode of a small model on CPU
(bench/decode_breakdown.py measures it). Here the step is the model's own modules (LoRA-wrapped or
quantised projections, other MLPs and the embeddings are called as they are), with four things done directly:
  * a plain Linear's product from the weight its call in the packing region would use (compiled_decode.Product: the same kernel
    on the same weight, the same bits), without the module call's Python work around each product; for small grouped-query
    models under bf16 autocast q/k/v and gate/up as one product each where that gives the same bits (layer_products.py);
  * RMSNorm, qwen3's per-head norms of q and k too, by `F.rms_norm` for the norms known to compute exactly it (on the
    CPU aten runs the same six ops, without the module call and its casts to and from fp32: 7 us less per call); on
    the CPU, where the C kernels build, the residual add before each norm, the norm and its cast to bf16 as one pass
    with the same bits (native_norm.py);
  * rotary embedding from the model's own rotary module, once per step for all layers (applied with the write of k
    and v into the buffers as one C pass on the CPU where it builds, whichever way the attention runs: native_rotary.py);
  * attention over the prompt once per group plus the row's own tokens (the shared-prefix layout of
    shared_prefix.py), each part with its log-sum-exp, merged exactly; each part is two batched
    products and a softmax (on the CPU faster than SDPA's flash kernel for one query per row; on
    other devices the repeated layout runs SDPA); keys and values are written in place into buffers,
    which on the CPU grow kv_buffers.GROW slots at a time and are read whole, the slots not yet written masked
    (products over a slice of a buffer ran at half the rate: config B's generation 0.87x, C's 0.93x,
    bench/results/decode_whole_amd.md); where the C kernel reads the rows' own slots, and on other devices, they are
    allocated once and read up to the slot written; the shared layout's prompt part through a C kernel too where timed
    faster (native_prefix.py, its keys transposed once per decode); under bf16
    autocast the buffers are fp32, or bf16 where this machine timed that faster at the decode's shapes
    (decode_attention.decode_attention_way: config C's generation 0.83-0.84x, bench/results/decode_kv_dtype_amd.md).
Rows keep one shape for the whole decode except at the few points where the engine compacts
finished rows out (DecodeState.select).

Only architectures whose layers are exactly pre-norm attention + MLP with rotary embeddings
(llama, mistral without a window, qwen2, qwen3) take it; anything else keeps the transformers path.
Multi-turn episodes take the same step (`step_episode`) on their own cache (episode_cache.py: rows at
lengths of their own), with that cache's attention.
tests/rollout/test_lean_decode.py checks tokens and log-probs against that plain path, for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

from rlvr.models.machine_cache import power_of_two_at_least
from rlvr.models.native_norm import PLAIN_RMS_NORMS, add_norm, rms_norm
from rlvr.models.norm_rotary import rotate, signed_sin
from rlvr.models.native_swiglu import swiglu
from rlvr.models.packed_linears import bf16_packs, packed_product
from rlvr.rollout.engines.hf import kv_buffers
from rlvr.rollout.engines.hf.compiled_decode import (
    CompiledLayers,
    LayerWeights,
    LoraProduct,
    Product,
    layer_weights,
)
from rlvr.rollout.engines.hf.decode_attention import AttentionWay, decode_attention, decode_attention_way
from rlvr.rollout.engines.hf.episode_cache import EpisodeLayer, EpisodeState, episode_attention, native_step, rotated_and_written
from rlvr.rollout.engines.hf.forward import cpu_bf16_autocast, padding_bias
from rlvr.rollout.engines.hf.layer_products import PLAIN_MLPS, LayerProducts, fuses, products_for
from rlvr.rollout.engines.hf.native_prefix import transposed_keys
from rlvr.rollout.engines.hf.shared_prefix import attend_prefix_and_own, supports_shared_prefix

ARCHITECTURES = {"llama", "mistral", "qwen2", "qwen3"}
_LAYER_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}


def _causal_lm(model):
    """The transformers CausalLM inside a peft wrapper (or the model itself)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base


def lean_decoder_for(model, compiled: CompiledLayers | None = None) -> "LeanDecoder | None":
    """A LeanDecoder when the model's architecture is one this step reproduces exactly, else None; with `compiled`,
    its CPU step runs the layers compiled where they are plain enough (compiled_decode.py)."""
    lm = _causal_lm(model)
    config = getattr(lm, "config", None)
    if config is None or config.model_type not in ARCHITECTURES or not supports_shared_prefix(config):
        return None
    inner = getattr(lm, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return None
    for layer in inner.layers:
        children = {name for name, _ in layer.named_children()}
        if children != _LAYER_PARTS or not all(hasattr(layer.self_attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return None
    return LeanDecoder(lm, compiled)


def _compilable(lm) -> bool:
    """Whether compiled_decode.decoder_layer computes what this model's layers compute: plain RMSNorms, the SiLU
    SwiGLU MLP, qwen3's per-head norms or none (the products are checked per call: layer_weights)."""
    layer = lm.model.layers[0]
    norms = [layer.input_layernorm, layer.post_attention_layernorm, lm.model.norm]
    norms += [getattr(layer.self_attn, n) for n in ("q_norm", "k_norm") if hasattr(layer.self_attn, n)]
    return (
        all(type(m).__name__ in PLAIN_RMS_NORMS for m in norms)
        and type(layer.mlp).__name__ in PLAIN_MLPS
        and getattr(lm.config, "hidden_act", None) == "silu"
        and all(getattr(m, "variance_epsilon", None) == layer.input_layernorm.variance_epsilon for m in norms)
    )


# the input that several products read (q, k and v; gate and up) cast to their dtype once, not once per product: generation
# 0.95-0.97x on configs B, F and L in bf16, the same tokens and log-probs (bench/results/cast_once_amd.md)
CAST_ONCE = True  # False: each product casts it (that A/B's "before")


def _as_sampled(logits: torch.Tensor) -> torch.Tensor:
    """A step's logits as the sampler takes them: bf16 as they are (its C pass reads them, its torch ops cast them), any
    other dtype (fp16, float64) as fp32."""
    return logits if logits.dtype == torch.bfloat16 else logits.float()


def _product(p: "Product | LoraProduct | torch.nn.Module", x: torch.Tensor, casts: dict | None = None) -> torch.Tensor:
    """p's output for x; `casts` (dtype -> x in it) is shared by the products that read this same x."""
    if isinstance(p, LoraProduct):  # peft's forward: result + lora_B(lora_A(x)) * scaling
        return _product(p.base, x, casts) + _product(p.b, _product(p.a, x, casts)) * p.scaling
    if not isinstance(p, Product):
        return p(x)  # the module as it is: a LoRA variant, quantised, outside a packing region, an autocast cast
    if casts is None or not CAST_ONCE:
        # the input in the product's dtype, as the region runs it
        return packed_product(x.to(p.weight.dtype), p.weight, p.bias, p.way, p.out_features)
    if p.weight.dtype not in casts:
        casts[p.weight.dtype] = x.to(p.weight.dtype)
    return packed_product(casts[p.weight.dtype], p.weight, p.bias, p.way, p.out_features)


@dataclass
class DecodeState:
    """The KV cache of one decode. Shared layout (long prompts): each prompt's keys/values once
    (prefix_*), each row's own tokens in buffers. Repeated layout (short prompts, where reading
    the prompt G times costs less than a second attention call): prefix_* is None and each row's
    buffer starts with its prompt's keys/values."""

    own_keys: list[torch.Tensor]  # per layer [n, Hkv, S, D]: S = (P if repeated) + T slots, or the slots grown so far
    own_values: list[torch.Tensor]
    bias: torch.Tensor  # shared: [B, 1, 1, P] over the prefix; repeated: [n, 1, 1, S]; 0 or -inf (left padding)
    rows: torch.Tensor  # [n] which of the B x G rows are still decoding (B: the groups with a row left, shared layout)
    group_size: int
    written: int  # slots of own_* in use (rows decode in lockstep)
    prefix_keys: list[torch.Tensor] | None = None  # shared layout: per layer [B, Hkv, P, D] (native_prefix: transposed_keys)
    prefix_values: list[torch.Tensor] | None = None  # set together with prefix_keys
    flash: bool = False  # on the CPU: attention through SDPA's flash kernel (decode_attention.py)
    native: bool = False  # on the CPU: the rows' own slots through the C kernel (native_attention.py)
    native_prefix: bool = False  # with native, shared: the prompt part too (native_prefix.py), prefix_keys transposed
    # Whole buffers (the eager step on the CPU): own_* hold the slots grown so far, kv_buffers.GROW at a time up to `slots` (all
    # at once where `native`), and attention reads them whole, the slots not yet written masked (-inf in `bias`, repeated layout, or in
    # own_bias, shared layout). 0: buffers of every slot, read up to the slot written (other devices, the compiled step).
    slots: int = 0
    own_bias: torch.Tensor | None = None  # whole buffers, shared layout: [1, 1, 1, S] 0 over written slots, -inf after

    def attention_args(self, i: int, scale: float) -> tuple:
        """decode_attention's arguments after q, k, v for layer i: the buffers, the slot this step writes, the bias,
        in the shared layout the prompt's keys/values with the rows they serve, and with whole buffers their mask."""
        pk, pv = self.prefix_keys, self.prefix_values  # set together: the shared layout
        prefix = (None, None) if pk is None or pv is None else (pk[i], pv[i])
        own = (self.own_keys[i], self.own_values[i], self.written, self.bias, scale)
        return (*own, *prefix, self.rows, self.group_size, self.own_bias, self.slots > 0)

    def open_slot(self) -> None:
        """Whole buffers: slot `written` made to exist (every buffer grown by kv_buffers.GROW slots when full) and unmasked."""
        t = self.written
        if not self.slots:
            return
        mask_name = "bias" if self.prefix_keys is None else "own_bias"
        if t == self.own_keys[0].shape[2]:  # full: grown, the new slots zero (an unwritten slot's 0 x -inf mask is 0)
            more = min(kv_buffers.GROW, self.slots - t)
            self.own_keys = [kv_buffers.grown(k, t + more) for k in self.own_keys]
            self.own_values = [kv_buffers.grown(v, t + more) for v in self.own_values]
            setattr(self, mask_name, F.pad(getattr(self, mask_name), (0, more), value=float("-inf")))
        getattr(self, mask_name).select(-1, t).zero_()

    def select(self, keep: torch.Tensor) -> None:
        """Keep only rows `keep` (indices into the current n): the few compaction points of a decode."""
        self.own_keys, self.own_values = [k[keep] for k in self.own_keys], [v[keep] for v in self.own_values]
        self.rows = self.rows[keep]
        if self.prefix_keys is None:
            self.bias = self.bias[keep]
            return
        # shared layout: groups with no row left go too: the attention with half the groups finished 0.58-0.67x, the same
        # bits (bench/results/compaction_groups_amd.md), where the prompt part ran every group, finished rows' queries zero
        G, groups = self.group_size, torch.div(self.rows, self.group_size, rounding_mode="floor")
        alive = torch.unique(groups)  # ascending
        if len(alive) < self.bias.shape[0] and self.prefix_values is not None:
            self.prefix_keys, self.prefix_values = [k[alive] for k in self.prefix_keys], [v[alive] for v in self.prefix_values]
            self.bias, self.rows = self.bias[alive], torch.searchsorted(alive, groups) * G + self.rows % G  # their places now


class LeanDecoder:
    def __init__(self, lm, compiled: CompiledLayers | None = None):
        self.lm = lm
        self.compiled = compiled if compiled is not None and _compilable(lm) else None
        self._weights: tuple[int, list[LayerWeights | None]] | None = None  # the compiled step's, for a row count
        inner = lm.model
        self.embed, self.layers, self.norm, self.rotary = inner.embed_tokens, inner.layers, inner.norm, inner.rotary_emb
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.kv_heads = lm.config.num_key_value_heads
        self.q_heads = lm.config.num_attention_heads
        self._direct: dict[tuple, list] = {}  # (rows bucket, autocast dtype, device) -> _products

    def start(
        self,
        cache,
        prompt_mask: torch.Tensor,
        group_size: int,
        capacity: int,
        dtype: torch.dtype | None = None,
        shared: bool | None = True,
    ) -> DecodeState:
        """State from the prefill's DynamicCache (keys/values [B, Hkv, P, D] per layer): buffers for
        `capacity` new tokens per row, in `dtype` when given (fp32 under bf16 autocast on CPU), or bf16 where the eager
        CPU step under bf16 autocast timed that faster (decode_attention_way)."""
        first = cache.layers[0].keys
        B, Hkv, P, D = first.shape
        G, device, N, dtype = group_size, first.device, B * group_size, dtype or first.dtype
        rows = torch.arange(N, device=device)
        bias = padding_bias(prompt_mask, dtype, float("-inf"))  # [B, 1, 1, P]
        # whole buffers (DecodeState.slots) where the eager step runs on the CPU: its batched products over a slice of
        # each row's buffer ran 2-2.5x as long as over a buffer of just those slots (the same bytes, read at half the rate)
        whole = kv_buffers.GROW > 0 and device.type == "cpu" and self.compiled is None
        # the eager CPU step's attention as timed fastest at these shapes: the flash kernel or explicit products, under bf16
        # autocast perhaps from bf16 buffers (decode_attention_way)
        lower = torch.bfloat16 if whole and cpu_bf16_autocast(self.lm) else None
        if shared is None and not whole:  # the layouts are timed for the eager CPU step only; elsewhere shared
            shared = True
        way = AttentionWay(dtype, False, bool(shared))
        if device.type == "cpu":
            layers = len(cache.layers)
            way = decode_attention_way(
                B, G, self.q_heads, Hkv, D, P, capacity, dtype, shared=shared, lower=lower, layers=layers, native=whole
            )
        shared = way.shared
        keys = [layer.keys.to(way.dtype) for layer in cache.layers]
        values = [layer.values.to(way.dtype) for layer in cache.layers]
        # grown GROW slots at a time where attention reads the buffers whole; the C kernel reads slots 0..t alone, so
        # there every slot at once (each growth copied the buffers: 3 % of a 256-token decode)
        size = min(kv_buffers.GROW, capacity) if whole and not way.native else capacity
        if shared:
            own_k, own_v = ([x.new_zeros(N, Hkv, size, D) for x in xs] for xs in (keys, values))
            own_bias = torch.full((1, 1, 1, size), float("-inf"), dtype=bias.dtype, device=device) if whole else None
            slots = capacity if whole else 0
            pk = [transposed_keys(k) for k in keys] if way.native_prefix else keys  # as that kernel reads them, once
            return DecodeState(own_k, own_v, bias, rows, G, 0, pk, values, way.flash, way.native, way.native_prefix, slots, own_bias)

        bias = F.pad(bias, (0, size), value=float("-inf") if whole else 0.0)  # own slots: -inf until written, or read sliced
        own_k = [kv_buffers.prompt_per_row(k, G, size) for k in keys]  # [N, Hkv, P + size, D], the prompt first
        own_v = [kv_buffers.prompt_per_row(v, G, size) for v in values]
        slots = P + capacity if whole else 0
        return DecodeState(own_k, own_v, bias.repeat_interleave(G, 0), rows, G, P, flash=way.flash, native=way.native, slots=slots)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """Logits [n, V] of the next token after `tokens` [n] at `positions` [n]: fp32, or bf16 where the lm_head's
        product ran in bf16 (under bf16 autocast), not cast: sample_tokens reads either (its C pass bf16 itself, its torch
        ops a fp32 copy), a [n, V] cast less per step than fp32 logits cost (2-3 ms at 152k tokens)."""
        state.open_slot()
        t = state.written

        def attend(i: int, q, k, v, scale: float, rotary) -> torch.Tensor:  # every row writes slot t, then reads slots 0..t
            own_k, own_v = state.own_keys[i], state.own_values[i]
            if q.device.type == "cpu":  # the rotation, the write and the attention as one call (decode_attention.py)
                with torch.autocast("cpu", enabled=False):
                    args = state.attention_args(i, scale)
                    flash, native, native_prefix = state.flash, state.native, state.native_prefix
                    return decode_attention(q, k, v, *args, flash=flash, native=native, native_prefix=native_prefix, rotary=rotary)
            q, k = rotate(q, *rotary), rotate(k, *rotary)
            own_k[:, :, t] = k
            own_v[:, :, t] = v
            return self._attend_on_device(q, own_k[:, :, : t + 1], own_v[:, :, : t + 1], i, state, scale)

        logits = self._compiled_forward(tokens, positions, state) if self.compiled is not None else None
        if logits is None:
            logits = self._forward(tokens, positions, attend)
        state.written = t + 1
        return logits

    def step_episode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        state: EpisodeState,
        last: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The same step for multi-turn episodes, whose rows are at lengths of their own: keys/values go into the
        episode cache's layers and attention is episode_attention, as in the model's own forward with that cache, or
        on the CPU where its C kernels run episode_cache.native_step (state.prepare() has set up the rows of this step
        and chosen the way). tokens and positions [n] (one token per row) or [n, K] (a
        chunk of external tokens per row, right-padded; last [n]: each row's last real token), or [M] with `keep` [n]
        (rows' runs of tokens side by side, none padded: EpisodeState.prepare_ragged; keep: each row's last token). Logits
        [n, V] (fp32) after each row's last token: a chunk's other tokens go through no lm_head."""
        n, K = tokens.shape[0], 1 if tokens.dim() == 1 else tokens.shape[1]

        def attend(i: int, q, k, v, scale: float, rotary) -> torch.Tensor:  # q [n x K, Hq, D], k/v [n x K, Hkv, D]
            layer = cast(EpisodeLayer, state.cache.layers[i])
            if state.step_native:  # the rotation, the writes and each token's attention in two C calls
                return native_step(layer, q, k, v, scale, rotary, state)
            q = rotated_and_written(layer, q, k, v, rotary, state)
            keys, values = layer.read()
            q = q.view(n, K, *q.shape[1:]).transpose(1, 2)  # [n, Hq, K, D]
            out, _ = episode_attention(self.layers[i].self_attn, q, keys, values, None, scaling=scale, rlvr_episode=state)
            return out.reshape(n * K, -1)  # [n, K, Hq, D] -> [n x K, Hq x D]

        if last is not None:
            keep = torch.arange(n, device=tokens.device) * K + last
        return self._forward(tokens.reshape(-1), positions.reshape(-1), attend, keep).float()

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend, keep: torch.Tensor | None = None) -> torch.Tensor:
        """The layers for n new tokens; attend(layer, q [n, Hq, D], k, v [n, Hkv, D], scale, (cos, sin_signed)) rotates
        q and k, stores k, v and returns the attention output [n, Hq x D]. Logits of the tokens `keep` (all when None)."""
        n = tokens.shape[0]
        x = self.embed(tokens)  # [n, hidden]
        cos, sin = self.rotary(x[:, None], positions[:, None])  # [n, 1, D]
        sin = signed_sin(sin)  # once for every layer: rotate's four ops instead of seven per rotation
        products = self._products(n, x.device)
        autocast = x.device.type == "cpu" and torch.is_autocast_enabled("cpu")
        bf16 = CAST_ONCE and autocast and torch.get_autocast_dtype("cpu") == torch.bfloat16  # products read bf16 copies
        delta = None  # the last MLP's output, added to x with the next norm
        for i, (layer, p) in enumerate(zip(self.layers, products)):
            attn = layer.self_attn
            x, h, casts = add_norm(layer.input_layernorm, x, delta, bf16)
            q, k, v = self._qkv(p, h, casts)
            if hasattr(attn, "q_norm"):  # qwen3: per-head RMSNorm before the rotation
                q, k = rms_norm(attn.q_norm, q), rms_norm(attn.k_norm, k)
            out = _product(p.o, attend(i, q, k, v, attn.scaling, (cos, sin)))
            x, h, casts = add_norm(layer.post_attention_layernorm, x, out, bf16)
            delta = self._mlp(layer, p, h, casts)
        if keep is not None:
            x, delta, products = (x if delta is None else x + delta)[keep], None, self._products(len(keep), x.device)
        x, h, casts = add_norm(self.norm, x, delta, bf16)
        return _as_sampled(_product(products[-1], h, casts))

    def _qkv(self, p: LayerProducts, h: torch.Tensor, casts: dict) -> tuple[torch.Tensor, ...]:
        """q [n, Hq, D], k and v [n, Hkv, D] of the normed h [n, hidden] (casts: h in other dtypes, _product's)."""
        n, D = h.shape[0], self.head_dim
        out = [_product(m, h, casts) for m in p.qkv]  # q, k, v; or one product, the three side by side
        q, k, v = out if len(out) == 3 else out[0].split([self.q_heads * D, self.kv_heads * D, self.kv_heads * D], -1)
        return q.view(n, self.q_heads, D), k.view(n, self.kv_heads, D), v.view(n, self.kv_heads, D)

    @staticmethod
    def _mlp(layer, p: LayerProducts, h: torch.Tensor, casts: dict) -> torch.Tensor:
        """The layer's MLP of the normed h [n, hidden] (casts: h in other dtypes, _product's)."""
        if p.down is None:  # an MLP of another kind: as it is
            return layer.mlp(h)
        out = [_product(m, h, casts) for m in p.gate_up]  # gate, up; or one product, both side by side
        gate, up = out if len(out) == 2 else out[0].chunk(2, -1)
        return _product(p.down, swiglu(layer.mlp.act_fn, gate, up))  # one C pass in bf16 (torch's bits)

    def _products(self, n: int, device: torch.device) -> list:
        """layer_products.products_for n rows, built once per rows bucket and autocast dtype in a decode (the weights do
        not change within one): the module calls' Python work, about a tenth of a small model's decode step, is paid once."""
        autocast = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
        key = (power_of_two_at_least(n), autocast, device.type)
        if key not in self._direct:
            self._direct[key] = products_for(self.layers, self.lm.lm_head, n, device, autocast, fuses(self.lm.config))
        return self._direct[key]

    def _compiled_forward(self, tokens: torch.Tensor, positions: torch.Tensor, state: DecodeState) -> torch.Tensor | None:
        """step's layers through compiled_decode.decoder_layer; None where a layer's products cannot run there (then
        the eager step runs: another device, a projection that is not a plain Linear, more rows than packing takes)."""
        n, compiled = tokens.shape[0], self.compiled
        if compiled is None or tokens.device.type != "cpu":
            return None
        autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        if self._weights is None or self._weights[0] != n:
            self._weights = (n, [layer_weights(layer, n, autocast, bf16_packs()) for layer in self.layers])
        weights = self._weights[1]
        if any(w is None for w in weights):
            return None
        x = self.embed(tokens)  # [n, hidden]
        cos, sin = self.rotary(x[:, None], positions[:, None])  # [n, 1, D]
        sin = signed_sin(sin)  # once for every layer, as in the eager step
        eps, heads = self.layers[0].input_layernorm.variance_epsilon, (self.q_heads, self.kv_heads, self.head_dim)
        with torch.autocast("cpu", enabled=False), compiled.running():
            for i, (layer, w) in enumerate(zip(self.layers, weights)):
                attention = state.attention_args(i, layer.self_attn.scaling)
                x = compiled(x, cos, sin, w, eps, heads, autocast or torch.float32, attention)
        return _as_sampled(self.lm.lm_head(rms_norm(self.norm, x)))

    def _attend_on_device(self, q, own_k, own_v, i: int, state: DecodeState, scale: float) -> torch.Tensor:
        """decode_attention's math on other devices: SDPA (repeated layout), shared_prefix's products (shared layout)."""
        n, Hkv, D = q.shape[0], self.kv_heads, self.head_dim
        rep, G = self.q_heads // Hkv, state.group_size
        q = q.to(own_k.dtype)
        if state.prefix_keys is None:
            out = F.scaled_dot_product_attention(
                q[:, :, None], own_k, own_v, attn_mask=state.bias[..., : own_k.shape[2]], scale=scale, enable_gqa=rep > 1
            )
            return out.reshape(n, Hkv * rep * D)
        assert state.prefix_values is not None, "set together with prefix_keys"
        out = attend_prefix_and_own(
            q.view(n, Hkv * rep, 1, D), own_k, own_v, state.prefix_keys[i], state.prefix_values[i],
            rows=state.rows, group_size=G, prefix_bias=state.bias, scaling=scale,
        )  # fmt: skip
        return out.reshape(n, Hkv * rep * D)
