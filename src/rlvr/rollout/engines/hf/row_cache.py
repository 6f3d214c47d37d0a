"""The continuous decoder's cache (continuous.py): every row's keys/values in its own buffer row, written at its own
positions, and the attention (`rlvr_rows`) of each row's new tokens against its own written slots
(scaled_dot_product_attention with a per-row mask), so rows of any lengths share a forward."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rlvr.models.attention import explicit_attention
from rlvr.rollout.engines.hf.attention import sdpa_cache_dtype


@dataclass
class RowsState:
    """One forward: `rows` [n] each feeding m tokens from position write_pos [n]; bias [n, 1, m, L]."""

    num_rows: int = 0
    capacity: int = 0
    rows: torch.Tensor | None = None
    write_pos: torch.Tensor | None = None
    bias: torch.Tensor | None = None

    def prepare(self, rows: torch.Tensor, write_pos: torch.Tensor, m: int, dtype: torch.dtype) -> None:
        self.rows, self.write_pos = rows, write_pos
        L = int(write_pos.max()) + m
        slots = torch.arange(L, device=rows.device)  # query i of row r sees slots <= write_pos[r] + i
        hidden = slots[None, None, :] > (write_pos[:, None, None] + torch.arange(m, device=rows.device)[None, :, None])
        self.bias = torch.zeros(len(rows), 1, m, L, dtype=dtype, device=rows.device).masked_fill(hidden[:, None], torch.finfo(dtype).min)


class RowLayer(DynamicLayer):
    """One layer's cache: each row's keys/values in its own buffer row, written at its own positions."""

    def __init__(self, state: RowsState, dtype: torch.dtype | None):
        super().__init__()
        self.state, self.dtype, self.is_initialized = state, dtype, True
        self.kbuf: torch.Tensor | None = None
        self.vbuf: torch.Tensor | None = None

    def _fit(self, like: torch.Tensor) -> None:
        """Buffers of at least state.num_rows x state.capacity, the rows written so far kept."""
        st, (_, H, _, D) = self.state, like.shape
        if self.kbuf is not None and self.kbuf.shape[0] >= st.num_rows and self.kbuf.shape[2] >= st.capacity:
            return
        k = like.new_zeros(st.num_rows, H, st.capacity, D, dtype=self.dtype or like.dtype)
        v = torch.zeros_like(k)
        if self.kbuf is not None and self.vbuf is not None:
            r, t = self.kbuf.shape[0], self.kbuf.shape[2]
            k[:r, :, :t], v[:r, :, :t] = self.kbuf, self.vbuf
        self.kbuf, self.vbuf = k, v

    def update(self, key_states, value_states, *args, **kwargs):
        st = self.state  # key_states [n, H, m, D]
        assert st.rows is not None and st.write_pos is not None and st.bias is not None, "prepare() runs before each forward"
        self._fit(key_states)
        assert self.kbuf is not None and self.vbuf is not None
        m = key_states.shape[2]
        pos = st.write_pos[:, None] + torch.arange(m, device=st.rows.device)  # [n, m]
        rows = st.rows[:, None].expand_as(pos)
        self.kbuf[rows, :, pos] = key_states.permute(0, 2, 1, 3).to(self.kbuf.dtype)  # [n, m, H, D]
        self.vbuf[rows, :, pos] = value_states.permute(0, 2, 1, 3).to(self.vbuf.dtype)
        L = st.bias.shape[-1]
        return self.kbuf[st.rows, :, :L], self.vbuf[st.rows, :, :L]  # [n, H, L, D]

    def get_seq_length(self) -> int:
        return 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0


def rows_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, rlvr_rows=None, **kwargs):
    """transformers attention function: each row's queries [n, Hq, m, D] against its own slots (RowsState.bias);
    any other call is SDPA."""
    if rlvr_rows is None:
        return sdpa_cache_dtype(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    with torch.autocast(query.device.type, enabled=False):
        bias = rlvr_rows.bias.to(key.dtype)
        if query.device.type == "cpu":  # as the lean decode step: two products beat the flash kernel for few queries
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            return explicit_attention(query.to(key.dtype), key, value, bias, scale).to(query.dtype), None  # [n, m, Hq, D]
        gqa = query.shape[1] != key.shape[1]
        sdpa = torch.nn.functional.scaled_dot_product_attention
        out = sdpa(query.to(key.dtype), key, value, attn_mask=bias, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous().to(query.dtype), None  # [n, m, Hq, D]


AttentionInterface.register("rlvr_rows", rows_attention)
AttentionMaskInterface.register("rlvr_rows", sdpa_mask)  # built by transformers, unused: RowsState.bias is the mask
