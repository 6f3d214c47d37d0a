"""KV-cache layers for the decode whose keys/values live in buffers allocated once, and the growth of the CPU decodes'
buffers that are read whole instead (lean_decode, episode_cache)."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from rlvr.models.kv_cache import prefilled_kv

# Slots the CPU decodes' KV buffers grow by (lean_decode.DecodeState, episode_cache.EpisodeLayer), which attention reads
# whole, the slots not yet written masked: batched products over a slice of a larger buffer ran at half the rate
# (bench/results/decode_whole_amd.md). At most GROW - 1 masked slots per row are read in vain; each growth copies the
# buffers once. 0: buffers of every slot, read sliced.
GROW = 16


def grown(buf: torch.Tensor, slots: int) -> torch.Tensor:
    """buf [N, H, S, D] with at least `slots` slots along S, the new ones zero (a masked slot's weight is then 0)."""
    N, H, S, D = buf.shape
    return buf if slots <= S else torch.cat([buf, buf.new_zeros(N, H, slots - S, D)], 2)


def prompt_per_row(x: torch.Tensor, group_size: int, slots: int) -> torch.Tensor:
    """The repeated layout's buffer: x [B, H, P, D] (each prompt's keys or values) -> [B x G, H, P + slots, D], every
    one of a prompt's G rows beginning with its P slots, the `slots` after them zero."""
    B, H, P, D = x.shape
    buf = x.new_zeros(B, group_size, H, P + slots, D)
    buf[..., :P, :] = x[:, None]
    return buf.view(B * group_size, H, P + slots, D)


class BufferedLayer(DynamicLayer):
    """A DynamicLayer whose keys/values live in buffers allocated once for the whole decode:
    each new token is written in place instead of re-concatenating the cache (which copies the
    entire cache every token: O(T^2) memory traffic, the main cost of decoding after long prompts)."""

    def __init__(self, layer: DynamicLayer, capacity: int, repeats: int = 1, dtype: torch.dtype | None = None):
        super().__init__()
        k, v = prefilled_kv(layer)  # [B, H, P, D] -> buffers [B x repeats, H, capacity, D]
        B, H, self.n, D = k.shape
        self.kbuf = k.new_empty(B * repeats, H, capacity, D, dtype=dtype or k.dtype)
        self.vbuf = v.new_empty(B * repeats, H, capacity, D, dtype=dtype or v.dtype)
        # one broadcast copy per buffer does the repeat_interleave and the fill together
        self.kbuf.view(B, repeats, H, capacity, D)[..., : self.n, :] = k[:, None]
        self.vbuf.view(B, repeats, H, capacity, D)[..., : self.n, :] = v[:, None]
        self.device, self.is_initialized = k.device, True
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self.kbuf[..., : self.n, :], self.vbuf[..., : self.n, :]

    def update(self, key_states, value_states, *args, **kwargs):
        m = key_states.shape[-2]
        self.kbuf[..., self.n : self.n + m, :] = key_states
        self.vbuf[..., self.n : self.n + m, :] = value_states
        self.n += m
        self._views()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.kbuf, self.vbuf = self.kbuf[indices], self.vbuf[indices]
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.kbuf, self.vbuf = self.kbuf.repeat_interleave(repeats, 0), self.vbuf.repeat_interleave(repeats, 0)
        self._views()
