"""The decode cache of multi-turn episodes: rows advance independently.

In a single-turn decode every row writes one token per step (lockstep). In an episode a row may
wait for a tool while the others go on, then take the tool's result one token per step, so rows
reach different lengths. Here each row writes its own tokens at its own position into buffers
allocated once ([N, H, capacity, D]); the prompt's keys/values stay once per group, as in
rlvr.rollout.shared_prefix, whose exact two-part attention (prompt once per group + the row's
own tokens, merged by log-sum-exp) is reused with a mask that hides each row's unwritten slots.
A row that waits is simply left out of the forward: it never leaves holes in its own cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer

from rlvr.rollout.attention import sdpa_cache_dtype
from rlvr.rollout.shared_prefix import attend_prefix_and_own


@dataclass
class EpisodeState:
    """What one decode forward needs besides q/k/v (shared by every layer, set by the decode loop)."""

    cache: object  # the DynamicCache whose layers are EpisodeLayers
    group_size: int
    prefix_bias: torch.Tensor  # [B, 1, 1, P] 0 on prompt tokens, -inf-like on left padding
    rows: torch.Tensor | None = None  # [n] the rows in this forward
    write_pos: torch.Tensor | None = None  # [n] where each row's new token goes in its own buffer
    own_bias: torch.Tensor | None = None  # [n, 1, 1, L] 0 on each row's written slots (incl. the new one)
    all_rows: bool = False  # rows == arange(N): the buffers can be read as views

    def prepare(self, rows: torch.Tensor, lengths: torch.Tensor, num_rows: int) -> None:
        """Set up a forward of one new token for each of `rows`; lengths [N]: tokens each row has written."""
        self.rows, self.write_pos = rows, lengths[rows]
        L = int(self.write_pos.max()) + 1
        slots = torch.arange(L, device=rows.device)
        dtype = self.prefix_bias.dtype
        self.own_bias = torch.zeros(len(rows), 1, 1, L, dtype=dtype, device=rows.device).masked_fill(
            (slots[None, :] > self.write_pos[:, None])[:, None, None, :], torch.finfo(dtype).min)
        self.all_rows = len(rows) == num_rows and bool((rows == torch.arange(num_rows, device=rows.device)).all())


class EpisodeLayer(DynamicLayer):
    """One layer's cache: the prompt's K/V once per group, each row's own K/V in its own buffer row."""

    def __init__(self, layer: DynamicLayer, state: EpisodeState, num_rows: int, capacity: int, dtype: torch.dtype | None = None):
        super().__init__()
        k, v = layer.keys, layer.values  # [B, H, P, D]
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
        L = st.own_bias.shape[-1]
        if st.all_rows:
            return self.kbuf[:, :, :L], self.vbuf[:, :, :L]
        return self.kbuf[st.rows, :, :L], self.vbuf[st.rows, :, :L]  # [n, H, L, D]

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
    dtype = layer.prefix_keys.dtype
    with torch.autocast(query.device.type, enabled=False):
        out = attend_prefix_and_own(query.to(dtype), key, value, layer.prefix_keys, layer.prefix_values, rows=rlvr_episode.rows,
                                    group_size=rlvr_episode.group_size, prefix_bias=rlvr_episode.prefix_bias,
                                    scaling=scaling, own_bias=rlvr_episode.own_bias)
    return out.to(query.dtype), None
