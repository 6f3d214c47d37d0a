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
    -> [n, K, Hq, D]."""
    n, Hq, K, D = query.shape
    Hkv = key.shape[1]
    rep = Hq // Hkv  # grouped-query attention: q heads j*rep..(j+1)*rep-1 share kv head j
    qr = rep * K  # query rows per kv head and row, ordered (head, token)
    scale = scaling if scaling is not None else D**-0.5
    q = query.reshape(n, Hkv, qr, D)
    B, G = prefix_keys.shape[0], group_size

    full = n == B * G  # every row, in order (rows ascend): no scatter into, or gather from, the B x G layout
    # prompt part: the group's G rows (x rep heads x K tokens) are the query rows of one product per group
    qf = q
    if not full:
        qf = q.new_zeros(B * G, Hkv, qr, D)
        qf[rows] = q
    qf = qf.view(B, G, Hkv, qr, D).transpose(1, 2).reshape(B, Hkv, G * qr, D)
    s = torch.matmul(qf, prefix_keys.transpose(-1, -2)) * scale + prefix_bias  # [B, Hkv, G*qr, P]
    m_p = s.amax(-1, keepdim=True)
    e = torch.exp(s - m_p)
    l_p, o_p = e.sum(-1, keepdim=True), torch.matmul(e, prefix_values)  # [B, Hkv, G*qr, 1], [.., D]

    def per_row(x):  # [B, Hkv, G*qr, X] -> [n, Hkv, qr, X]
        X = x.shape[-1]
        x = x.view(B, Hkv, G, qr, X).transpose(1, 2).reshape(B * G, Hkv, qr, X)
        return x if full else x[rows]

    m_p, l_p, o_p = per_row(m_p), per_row(l_p), per_row(o_p)

    # the row's own tokens
    s = torch.matmul(q, key.transpose(-1, -2)) * scale  # [n, Hkv, qr, t]
    if own_bias is not None:
        s = s + (own_bias if K == 1 else own_bias.repeat(1, 1, rep, 1))  # [n, 1, K, t] -> the (head, token) rows
    m_s = s.amax(-1, keepdim=True)
    e = torch.exp(s - m_s)
    l_s, o_s = e.sum(-1, keepdim=True), torch.matmul(e, value)

    # exact merge of the two partial softmaxes
    m = torch.maximum(m_p, m_s)
    a, b = torch.exp(m_p - m), torch.exp(m_s - m)
    out = (o_p * a + o_s * b) / (l_p * a + l_s * b)  # [n, Hkv, qr, D]
    return out.view(n, Hq, K, D).transpose(1, 2)  # transformers' layout after attention: [batch, q_len, heads, D]
