"""Decode attention that reads each prompt's keys and values once for its G samples.

After the prompt is prefilled once, the G samples of a group differ only in what they generate.
Repeating the prompt's KV cache G times (the simple way) makes every decode step read G copies
of it: for long prompts that memory traffic is most of the decode's cost. Here the prompt's
keys/values stay [B, H, P, D] and each sample's own tokens go to a buffer [N, H, T, D]. Per step,
the G queries of a group attend to their prompt together (one [G, D] x [D, P] product per group
and head instead of G vector products) and to their own tokens separately; the two partial
softmaxes are merged exactly by their log-sum-exp, as in cascade / shared-prefix attention
(Hydragen, FlashInfer's cascade attention).

Used by the hf engine for models whose layers are all plain full attention (Llama, Qwen2,
SmolLM, Mistral without a window, ...); anything else keeps the repeated cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer

from rlvr.models.kv_cache import prefilled_kv
from rlvr.rollout.engines.hf.attention import sdpa_cache_dtype
from rlvr.rollout.engines.hf.decode_attention import attend, attend_with_lse
from rlvr.rollout.engines.hf.kv_buffers import BufferedLayer


class SharedPrefixLayer(BufferedLayer):
    """One layer's cache: the prompt's K/V once per prompt; each sample's new K/V in the buffers
    (`keys`/`values` are the samples' own tokens only: the attention adds the prompt)."""

    def __init__(self, layer: DynamicLayer, group_size: int, capacity: int, dtype: torch.dtype | None = None):
        DynamicLayer.__init__(self)
        k, v = prefilled_kv(layer)  # [B, H, P, D]
        B, H, self.prefix_len, D = k.shape
        self.prefix_keys, self.prefix_values = k.to(dtype or k.dtype), v.to(dtype or v.dtype)
        self.kbuf = k.new_empty(B * group_size, H, capacity, D, dtype=dtype or k.dtype)  # [N, H, T, D]
        self.vbuf = v.new_empty(B * group_size, H, capacity, D, dtype=dtype or v.dtype)
        self.n = 0  # tokens generated so far (the same for every row: they decode in lockstep)
        self.device, self.is_initialized = k.device, True
        self._views()

    def get_seq_length(self) -> int:
        return self.prefix_len + self.n

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.prefix_len + self.n + query_length, 0


@dataclass
class PrefixState:
    """What the attention needs besides q/k/v, passed through the model's forward kwargs."""

    cache: object  # the DynamicCache whose layers are SharedPrefixLayers
    rows: torch.Tensor  # [n] which of the N = B x G rows are still decoding (prompt i owns rows iG..iG+G-1)
    group_size: int
    prefix_bias: torch.Tensor  # [B, 1, 1, P] 0 on prompt tokens, -inf-like on left padding


def supports_shared_prefix(config) -> bool:
    """Only plain causal full attention: no logit soft-capping, no sliding windows, no sinks."""
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if getattr(config, "attn_logit_softcapping", None) or getattr(config, "use_sliding_window", False):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    window = getattr(config, "sliding_window", None)
    return not window or getattr(config, "use_sliding_window", None) is False


def shared_prefix_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, rlvr_prefix=None, **kwargs):
    """transformers attention function: one new token per row against (prompt once per group) +
    (the row's own tokens). Any other call (the prefill, a layer without the split cache) is SDPA."""
    layer = None if rlvr_prefix is None else rlvr_prefix.cache.layers[module.layer_idx]
    if query.shape[2] != 1 or not isinstance(layer, SharedPrefixLayer):
        return sdpa_cache_dtype(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    dtype = layer.prefix_keys.dtype  # the cache's dtype (fp32 also under bf16 autocast: see rlvr.rollout.engines.hf.attention)
    with torch.autocast(query.device.type, enabled=False):
        out = attend_prefix_and_own(
            query.to(dtype),
            key,
            value,
            layer.prefix_keys,
            layer.prefix_values,
            rows=rlvr_prefix.rows,
            group_size=rlvr_prefix.group_size,
            prefix_bias=rlvr_prefix.prefix_bias,
            scaling=scaling,
        )
    return out.to(query.dtype), None


def attend_prefix_and_own(
    query, key, value, prefix_keys, prefix_values, *, rows, group_size: int, prefix_bias, scaling=None, own_bias=None
):
    """K new tokens per row (K = 1 in a decode step): attention over its group's prompt (prefix_keys/values
    [B, Hkv, P, D], once per group) and over its own tokens (key/value [n, Hkv, t, D]; own_bias [n, 1, K, t]
    masks, per query, the slots it must not see: unwritten ones, and later tokens of its own chunk), the two
    partial softmaxes merged exactly. query [n, Hq, K, D]; rows [n]: which of the B x G rows these are.
    prefix_keys None (the repeated layout: each row's own keys begin with its prompt's, own_bias masking its padding):
    the own part alone, one softmax. -> [n, K, Hq, D]."""
    n, Hq, K, D = query.shape
    Hkv = key.shape[1]
    rep = Hq // Hkv  # grouped-query attention: q heads j*rep..(j+1)*rep-1 share kv head j
    qr = rep * K  # query rows per kv head and row, ordered (head, token)
    scale = scaling if scaling is not None else D**-0.5
    q = query.reshape(n, Hkv, qr, D)
    # the row's own tokens; own_bias [n, 1, K, t] -> the (head, token) query rows
    bias = own_bias if own_bias is None or K == 1 else own_bias.repeat(1, 1, rep, 1)
    if prefix_keys is None:
        return attend(q, key, value, scale, bias)[0].view(n, Hq, K, D).transpose(1, 2)
    B, G = prefix_keys.shape[0], group_size

    full = n == B * G  # every row, in order (rows ascend): no scatter into, or gather from, the B x G layout
    # prompt part: the group's G rows (x rep heads x K tokens) are the query rows of one product per group
    qf = q if full else q.new_zeros(B * G, Hkv, qr, D).index_copy_(0, rows, q)
    qf = qf.view(B, G, Hkv, qr, D).transpose(1, 2).reshape(B, Hkv, G * qr, D)
    o_p, lse_p = attend_with_lse(qf, prefix_keys, prefix_values, scale, prefix_bias)  # [B, Hkv, G*qr, D], [B, Hkv, G*qr]
    o_p = o_p.view(B, Hkv, G, qr, D).transpose(1, 2).reshape(B * G, Hkv, qr, D)
    lse_p = lse_p.view(B, Hkv, G, qr).transpose(1, 2).reshape(B * G, Hkv, qr)
    if not full:
        o_p, lse_p = o_p[rows], lse_p[rows]  # [n, Hkv, qr, D], [n, Hkv, qr]

    o_s, lse_s = attend_with_lse(q, key, value, scale, bias)

    # exact merge of the two partial softmaxes: weights exp(lse_p) and exp(lse_s), normalised
    w = torch.sigmoid(lse_p - lse_s)[..., None]  # in the scores' dtype (the outputs' may be lower: bf16 buffers)
    out = torch.lerp(o_s.to(w.dtype), o_p.to(w.dtype), w)  # [n, Hkv, qr, D]
    return out.view(n, Hq, K, D).transpose(1, 2)  # transformers' layout after attention: [batch, q_len, heads, D]
