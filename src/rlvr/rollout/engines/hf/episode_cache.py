"""The decode cache of multi-turn episodes: rows advance independently.

In a single-turn decode every row writes one token per step (lockstep). In an episode a row may
wait for a tool while the others go on, then take the tool's result one token per step, so rows
reach different lengths. Here each row writes its own tokens at its own position into buffers
allocated once ([N, H, capacity, D]); the prompt's keys/values stay once per group, as in
rlvr.rollout.engines.hf.shared_prefix, whose exact two-part attention (prompt once per group + the row's
own tokens, merged by log-sum-exp) is reused with a mask that hides each row's unwritten slots.
A row that waits is simply left out of the forward: it never leaves holes in its own cache.
When most rows are in a forward, the attention reads every row's buffer in place and drops the
outputs of the rows not in it, rather than copying the rows' buffers out at every layer and step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlvr.models.kv_cache import prefilled_kv
from rlvr.rollout.engines.hf.attention import sdpa_cache_dtype
from rlvr.rollout.engines.hf.shared_prefix import attend_prefix_and_own


# A forward of at least this share of the rows reads every row's buffer in place (the rows not in
# it compute an output that is dropped) instead of copying out the rows' buffers: the copy costs
# more than the extra rows from about a quarter of them (measured on CPU).
READ_IN_PLACE_SHARE = 0.25


@dataclass
class EpisodeState:
    """What one decode forward needs besides q/k/v (shared by every layer, set by the decode loop)."""

    cache: DynamicCache  # its layers are EpisodeLayers
    group_size: int
    prefix_bias: torch.Tensor  # [B, 1, 1, P] 0 on prompt tokens, -inf-like on left padding
    rows: torch.Tensor | None = None  # [n] the rows in this forward, ascending
    write_pos: torch.Tensor | None = None  # [n] where each row's new token goes in its own buffer
    in_place: bool = False  # the attention reads all N rows' buffers as views and keeps the outputs of `rows`
    read_rows: torch.Tensor | None = None  # [m] the rows the attention computes: `rows`, or all N when in_place
    own_bias: torch.Tensor | None = None  # [m, 1, 1, L] 0 on each read row's written slots (incl. the new one)

    def prepare(self, rows: torch.Tensor, lengths: torch.Tensor, num_rows: int) -> None:
        """Set up a forward of one new token for each of `rows`; lengths [N]: tokens each row has written."""
        self.rows, self.write_pos = rows, lengths[rows]
        self.in_place = len(rows) >= READ_IN_PLACE_SHARE * num_rows
        self.read_rows = torch.arange(num_rows, device=rows.device) if self.in_place else rows
        L = int(self.write_pos.max()) + 1
        slots = torch.arange(L, device=rows.device)
        dtype = self.prefix_bias.dtype
        # a row outside the forward also sees its next, unwritten slot (zeros): finite, and its output is dropped
        self.own_bias = torch.zeros(len(self.read_rows), 1, 1, L, dtype=dtype, device=rows.device).masked_fill(
            (slots[None, :] > lengths[self.read_rows][:, None])[:, None, None, :], torch.finfo(dtype).min
        )


class EpisodeLayer(DynamicLayer):
    """One layer's cache: the prompt's K/V once per group, each row's own K/V in its own buffer row."""

    def __init__(self, layer: DynamicLayer, state: EpisodeState, num_rows: int, capacity: int, dtype: torch.dtype | None = None):
        super().__init__()
        k, v = prefilled_kv(layer)  # [B, H, P, D]
        B, H, self.prefix_len, D = k.shape
        self.prefix_keys, self.prefix_values = k.to(dtype or k.dtype), v.to(dtype or v.dtype)
        self.kbuf = k.new_zeros(num_rows, H, capacity, D, dtype=dtype or k.dtype)  # [N, H, T, D]
        self.vbuf = v.new_zeros(num_rows, H, capacity, D, dtype=dtype or v.dtype)
        self.state, self.device, self.is_initialized = state, k.device, True
        self.keys, self.values = self.kbuf[..., :0, :], self.vbuf[..., :0, :]

    def update(self, key_states, value_states, *args, **kwargs):
        st = self.state  # key_states [n, H, 1, D]
        self.kbuf[st.rows, :, st.write_pos] = key_states[:, :, 0].to(self.kbuf.dtype)
        self.vbuf[st.rows, :, st.write_pos] = value_states[:, :, 0].to(self.vbuf.dtype)
        assert st.own_bias is not None, "the decode loop calls state.prepare() before every forward"
        L = st.own_bias.shape[-1]
        if st.in_place:
            return self.kbuf[:, :, :L], self.vbuf[:, :, :L]  # [N, H, L, D] views
        return self.kbuf[st.rows, :, :L], self.vbuf[st.rows, :, :L]  # [n, H, L, D] copies

    def get_seq_length(self) -> int:
        return self.prefix_len

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.prefix_len + query_length, 0


def episode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, rlvr_episode=None, **kwargs):
    """transformers attention function: one new token per row against (prompt once per group) +
    (the row's own written tokens). Any other call (the prefill) is SDPA."""
    layer = None if rlvr_episode is None else rlvr_episode.cache.layers[module.layer_idx]
    if query.shape[2] != 1 or not isinstance(layer, EpisodeLayer):
        return sdpa_cache_dtype(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    st, dtype = rlvr_episode, layer.prefix_keys.dtype
    n, m = len(st.rows), len(st.read_rows)
    with torch.autocast(query.device.type, enabled=False):
        q = query.to(dtype)  # [n, Hq, 1, D]
        if m != n:  # in place: a query for every row, the rows outside the forward left at zero
            q = q.new_zeros(m, *q.shape[1:]).index_copy_(0, st.rows, q)
        out = attend_prefix_and_own(
            q,
            key,
            value,
            layer.prefix_keys,
            layer.prefix_values,
            rows=st.read_rows,
            group_size=st.group_size,
            prefix_bias=st.prefix_bias,
            scaling=scaling,
            own_bias=st.own_bias,
        )
        if m != n:
            out = out[st.rows]
    return out.to(query.dtype), None
