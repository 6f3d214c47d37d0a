"""The decode cache of multi-turn episodes: rows advance independently.

In a single-turn decode every row writes one token per step (lockstep). In an episode a row may
wait for a tool while the others go on, then take the tool's result, so rows reach different
lengths. Here each row writes its own tokens at its own position into buffers
([N, H, capacity, D]). On the CPU each row's buffers begin with its prompt's keys/values (the repeated layout,
EpisodeState.prompt_slots: one softmax over prompt and own tokens, the prompt's padding masked); elsewhere the
prompt's keys/values stay once per group, as in rlvr.rollout.engines.hf.shared_prefix, whose exact two-part
attention (prompt once per group + the row's own tokens, merged by log-sum-exp) is reused; either way with a mask
that hides each row's unwritten slots (on the CPU the buffers grow kv_buffers.GROW slots at a time and are read whole).
Under bf16 autocast on the CPU the buffers are fp32, or bf16 where this machine timed the single-turn decode's
attention of this layout faster so (episode_decode._attention_way; the scores, softmax and merge stay fp32).
A row that waits is simply left out of the forward: it never leaves holes in its own cache. A tool's
result goes in as one chunk (a forward of K tokens for that row, causal within the chunk), not one token
per step: rows taking chunks of different lengths are right-padded to the longest, and the padding is
neither written nor read by any real token.
When most rows are in a forward, the attention reads every row's buffer in place and drops the
outputs of the rows not in it, rather than copying the rows' buffers out at every layer and step.
lean_decode's step on the CPU, where the C kernels build and the repeated layout's attention runs through the C kernel
(EpisodeState.native), goes further (native_step): one C pass rotates q and k and writes k and v at each token's own
buffer row and slot (native_rotary.rotate_and_write_at), and the attention kernel reads, for each token in the forward
alone, its row's slots up to its own (native_attention with rows and lengths): no mask, no copies, no rows outside the
forward, a tool result's chunk as its tokens side by side; nothing reads the buffers whole, so they hold every slot
from the start. Config H's generation 0.79x (bench/results/episode_c_passes_amd.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlvr.models.kv_cache import prefilled_kv
from rlvr.models.norm_rotary import rotate
from rlvr.rollout.engines.hf import kv_buffers, native_rotary
from rlvr.rollout.engines.hf.attention import sdpa_cache_dtype
from rlvr.rollout.engines.hf.native_attention import native_attention
from rlvr.rollout.engines.hf.shared_prefix import attend_prefix_and_own


# lean_decode's one-token steps through native_step where the C attention kernel runs (EpisodeState.native): the rows in
# the step alone, each read to its own length (False: the mask built per step, the rows read in place; its A/B's before)
NATIVE_STEP = True
# lean_decode's other forwards (a tool result's chunk, the torch attention's steps) rotate q and k and write k and v in one
# C pass (native_rotary.rotate_and_write_at) instead of torch's rotations and index writes (False: those; its A/B's before)
NATIVE_WRITES = True
# ...and a tool result's chunk through native_step too: each token a query of its own, read to its own slot (causal within
# the chunk), no rows' buffers copied out and no mask built (False: the explicit products over the rows' copies)
NATIVE_CHUNKS = True

# A one-token forward of at least this share of the rows reads every row's buffer in place (the rows not in
# it compute an output that is dropped) instead of copying out the rows' buffers: the copy costs
# more than the extra rows from about a quarter of them (measured on CPU).
READ_IN_PLACE_SHARE = 0.25
CHUNKS_BY_LENGTH = True  # False: chunks take the one-token share too (bench/episode_chunks_in_place_ab.py's "before")
# where every forward reads each token's slots alone (reads_own_slots), a step's sampled tokens and its tool results'
# chunks run as one forward of their tokens side by side, none padded (prepare_ragged; False: two forwards, the chunks
# right-padded to the longest: its A/B's before)
RAGGED = True


def read_in_place_share(K: int) -> float:
    """The share of rows from which a forward of K tokens per row reads in place. A row left out still computes K
    queries over its whole buffer, where copying a taken row's buffer out costs the same whatever K: at the one-token
    share s a copy costs (1 - s) / s one-token attentions (3 at a quarter), so a chunk breaks even at K / (K + 3) of
    the rows (0.89 for a 24-token tool result). 0 (always) and from 1 (never) stay as they are."""
    s = READ_IN_PLACE_SHARE
    if K == 1 or not CHUNKS_BY_LENGTH or s <= 0 or s >= 1:
        return s
    copy = (1 - s) / s
    return K / (K + copy)


@dataclass
class EpisodeState:
    """What one decode forward needs besides q/k/v (shared by every layer, set by the decode loop)."""

    cache: DynamicCache  # its layers are EpisodeLayers
    group_size: int
    prefix_bias: torch.Tensor  # [B, 1, 1, P] 0 on prompt tokens, -inf-like on left padding
    # repeated layout: each row's buffers start with its prompt's P slots (the prompt read as part of the row's own, one
    # softmax); 0: the shared layout (the prompt once per group, a second part merged)
    prompt_slots: int = 0
    rows: torch.Tensor | None = None  # [n] the rows in this forward, ascending
    write_pos: torch.Tensor | None = None  # [n, K] where each row's new tokens go in its own buffer
    real: tuple[torch.Tensor, torch.Tensor] | None = None  # (row index, token index) of the real tokens; None: all (K = 1)
    in_place: bool = False  # the attention reads all N rows' buffers as views and keeps the outputs of `rows`
    read_rows: torch.Tensor | None = None  # [m] the rows the attention computes: `rows`, or all N when in_place
    own_bias: torch.Tensor | None = None  # [m, 1, K, L] 0 on the slots each query of a read row sees (incl. its own)
    native: bool = False  # repeated layout: a one-token forward attends through the C kernel (native_attention.py)
    # lean_decode's step runs the forwards (not the model's forward): its attention calls rotated_and_written, or with
    # native native_step (two C calls over the tokens in the forward alone, each read to its own slot: no mask built per
    # forward, no row read that is not in it)
    lean: bool = False
    step_native: bool = False  # this forward takes native_step (prepare sets it)
    lengths: torch.Tensor | None = None  # step_native: [n x K] slots each token reads (its row's prompt and own, itself too)
    query_rows: torch.Tensor | None = None  # step_native: [n x K] each token's row
    length: int = 0  # step_native: the most slots a token reads
    # lean: [n x K] where each new token's slot begins in the buffers (elements; -1: a chunk's padding, not written), for
    # native_rotary.rotate_and_write_at; None: the torch writes (update)
    slot_at: torch.Tensor | None = None
    slot_bias: torch.Tensor | None = None  # step_native: [N, 1, 1, P + capacity] -inf on the prompt's left padding, else 0

    def reads_own_slots(self) -> bool:
        """Whether every forward (the one-token steps and the chunks) goes through native_step, reading each token's
        slots alone: no forward reads the buffers whole."""
        return self._native_layout() and NATIVE_STEP and NATIVE_CHUNKS

    def _native_layout(self) -> bool:
        """native_step can run here: the C kernel's way, lean_decode's step, the repeated layout, fp32 scores."""
        return self.native and self.lean and self.prompt_slots > 0 and self.prefix_bias.dtype == torch.float32

    def prepare(self, rows: torch.Tensor, lengths: torch.Tensor, num_rows: int, counts: torch.Tensor | None = None) -> None:
        """Set up a forward of counts[i] new tokens (one when counts is None) for each of `rows`, right-padded to the
        largest count; lengths [N]: tokens each row has written."""
        K = 1 if counts is None else int(counts.max())
        self.step_native = self._native_layout() and (NATIVE_STEP if K == 1 else NATIVE_CHUNKS)
        steps = torch.arange(K, device=rows.device)
        self.rows, self.write_pos = rows, self.prompt_slots + lengths[rows][:, None] + steps  # [n, K]
        if counts is None or K == 1:
            self.real = None
        else:
            i, j = (steps[None, :] < counts[:, None]).nonzero(as_tuple=True)
            self.real = (i, j)
        if self.step_native:
            self._prepare_native_step(rows, K if counts is None else counts)
            return
        self.in_place = len(rows) >= read_in_place_share(K) * num_rows
        self.read_rows = torch.arange(num_rows, device=rows.device) if self.in_place else rows
        layers = [cast("EpisodeLayer", layer) for layer in self.cache.layers]
        sees = self.prompt_slots + lengths[self.read_rows][:, None] + steps  # [m, K] the last own slot each query sees
        L = min(int(sees.max()) + 1, layers[0].capacity)  # a padded query past the buffer sees less: its output is dropped
        if layers[0].grows:  # read whole: grown to hold slot L - 1, the slots after each query's masked below
            for layer in layers:
                layer.hold(L)
            L = layers[0].kbuf.shape[2]
        slots = torch.arange(L, device=rows.device)
        dtype = self.prefix_bias.dtype
        # a row outside the forward (and a padded query) also sees unwritten slots (zeros): finite, its output is dropped
        self.own_bias = torch.zeros(len(self.read_rows), 1, K, L, dtype=dtype, device=rows.device).masked_fill(
            (slots[None, None, :] > sees[:, :, None])[:, None], torch.finfo(dtype).min
        )
        if self.prompt_slots:  # the prompt's slots: its left padding masked, as prefix_bias masks it in the shared layout
            groups = torch.div(self.read_rows, self.group_size, rounding_mode="floor")
            self.own_bias[..., : self.prompt_slots] += self.prefix_bias[groups]
        self.slot_at = self._slot_offsets(layers[0].kbuf) if self.lean and NATIVE_WRITES else None

    def prepare_ragged(self, rows: torch.Tensor, lengths: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Set up one forward of counts[i] new tokens for each of `rows` side by side, none padded (reads_own_slots
        only: native_step takes each token to its own slot): -> [sum(counts)] each token's index in its row's run."""
        assert self.reads_own_slots(), "ragged forwards read each token's slots alone"
        self.step_native, self.real, self.rows = True, None, rows
        self.query_rows = rows.repeat_interleave(counts)  # [M]
        firsts = torch.cumsum(counts, 0) - counts  # [n] each row's first token in the forward
        steps = torch.arange(len(self.query_rows), device=rows.device) - firsts.repeat_interleave(counts)  # [M]
        write_pos = self.prompt_slots + lengths[self.query_rows] + steps  # [M] each token's slot
        self.write_pos, self.lengths = write_pos[:, None], write_pos + 1
        self.length = int(self.lengths.max())
        layer = cast("EpisodeLayer", self.cache.layers[0])
        self._slot_bias(layer)
        self.slot_at = native_rotary.slot_offsets(layer.kbuf, self.query_rows, write_pos)
        return steps

    def _slot_bias(self, layer: "EpisodeLayer") -> None:
        """slot_bias, made once: -inf on each row's prompt's left padding, 0 on its other slots."""
        if self.slot_bias is None:
            N, P = layer.kbuf.shape[0], self.prompt_slots
            groups = torch.div(torch.arange(N, device=layer.kbuf.device), self.group_size, rounding_mode="floor")
            prompt = self.prefix_bias[groups].masked_fill(self.prefix_bias[groups] < 0, float("-inf"))  # not read at all
            self.slot_bias = torch.cat([prompt, prompt.new_zeros(N, 1, 1, layer.capacity - P)], -1)

    def _slot_offsets(self, kbuf: torch.Tensor) -> torch.Tensor:
        """[n x K] where each new token's slot begins in the buffers (elements; every layer's have kbuf's strides), a
        chunk's padding -1 (not written): native_rotary.rotate_and_write_at's slot_at."""
        assert self.rows is not None and self.write_pos is not None
        if self.real is None:  # one token per row
            return native_rotary.slot_offsets(kbuf, self.rows, self.write_pos[:, 0])
        at = native_rotary.slot_offsets(kbuf, self.rows[self.real[0]], self.write_pos[self.real])  # the real tokens'
        return torch.full(self.write_pos.shape, -1, dtype=at.dtype, device=at.device).index_put_(self.real, at).view(-1)

    def _prepare_native_step(self, rows: torch.Tensor, counts: torch.Tensor | int) -> None:
        """prepare for native_step: each row writes its tokens at slots P + its length on and each token reads the slots
        up to its own (a chunk's padding up to the row's last real token: its output is dropped)."""
        assert self.write_pos is not None
        layers = [cast("EpisodeLayer", layer) for layer in self.cache.layers]
        reads = self.write_pos + 1  # [n, K]
        if self.real is not None:
            reads = torch.minimum(reads, self.write_pos[:, :1] + torch.as_tensor(counts)[:, None])
        self.lengths = reads.reshape(-1)  # [n x K]
        self.query_rows = rows if reads.shape[1] == 1 else rows.repeat_interleave(reads.shape[1])
        self.length = int(self.lengths.max())
        if layers[0].grows:
            for layer in layers:
                layer.hold(self.length)
        self._slot_bias(layers[0])
        self.slot_at = self._slot_offsets(layers[0].kbuf)


class EpisodeLayer(DynamicLayer):
    """One layer's cache: the prompt's K/V once per group, each row's own K/V in its own buffer row."""

    def __init__(self, layer: DynamicLayer, state: EpisodeState, num_rows: int, capacity: int, dtype: torch.dtype | None = None):
        super().__init__()
        k, v = prefilled_kv(layer)  # [B, H, P, D]
        B, H, self.prefix_len, D = k.shape
        k, v = k.to(dtype or k.dtype), v.to(dtype or v.dtype)
        P = state.prompt_slots  # repeated layout: the prompt at the head of each row's buffers, else once per group here
        self.prefix_keys: torch.Tensor | None = None if P else k
        self.prefix_values: torch.Tensor | None = None if P else v
        # on the CPU the buffers grow kv_buffers.GROW slots at a time and are read whole (EpisodeState.prepare), as
        # the single-turn decode's
        # ...unless every forward reads each token's slots alone (native_step's): then every slot at once, as the
        # single-turn decode's C kernel has them (each growth copied the buffers: 4 % of config H's generation)
        self.capacity, self.grows = P + capacity, kv_buffers.GROW > 0 and k.device.type == "cpu" and not state.reads_own_slots()
        own = min(kv_buffers.GROW, capacity) if self.grows else capacity
        if P:  # [N, H, P + own, D]
            self.kbuf, self.vbuf = kv_buffers.prompt_per_row(k, state.group_size, own), kv_buffers.prompt_per_row(v, state.group_size, own)
        else:  # [N, H, own, D]
            self.kbuf, self.vbuf = k.new_zeros(num_rows, H, own, D), v.new_zeros(num_rows, H, own, D)
        self.state, self.device, self.is_initialized = state, k.device, True
        self.keys, self.values = self.kbuf[..., :0, :], self.vbuf[..., :0, :]

    def hold(self, slots: int) -> None:
        """Buffers of at least `slots` slots: the rows' own slots grown to the next multiple of kv_buffers.GROW (at
        most capacity), new slots zero."""
        if slots > self.kbuf.shape[2]:
            P = self.state.prompt_slots
            size = min(P + -(-(slots - P) // kv_buffers.GROW) * kv_buffers.GROW, self.capacity)
            self.kbuf, self.vbuf = kv_buffers.grown(self.kbuf, size), kv_buffers.grown(self.vbuf, size)
            self.keys, self.values = self.kbuf[..., :0, :], self.vbuf[..., :0, :]

    def update(self, key_states, value_states, *args, **kwargs):
        st = self.state  # key_states [n, H, K, D]
        assert st.own_bias is not None and st.write_pos is not None and st.rows is not None, "state.prepare() comes first"
        self.write(key_states, value_states)
        return self.read()

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values this forward's attention reads (written already): every row's as views, or the rows in it."""
        st = self.state
        assert st.own_bias is not None and st.rows is not None, "state.prepare() comes first"
        L = st.own_bias.shape[-1]
        if st.in_place:
            return self.kbuf[:, :, :L], self.vbuf[:, :, :L]  # [N, H, L, D] views
        return self.kbuf[st.rows, :, :L], self.vbuf[st.rows, :, :L]  # [n, H, L, D] copies

    def write(self, key_states, value_states) -> None:
        """key_states / value_states [n, H, K, D] into each token's slot (a chunk's padding not written)."""
        st = self.state
        assert st.write_pos is not None and st.rows is not None
        if st.real is None:  # one token per row
            pos = st.write_pos[:, 0]
            self.kbuf[st.rows, :, pos] = key_states[:, :, 0].to(self.kbuf.dtype)
            self.vbuf[st.rows, :, pos] = value_states[:, :, 0].to(self.vbuf.dtype)
        else:  # chunks: only the real tokens are written (padding could run past the buffer)
            i, j = st.real
            rows, pos = st.rows[i], st.write_pos[i, j]
            self.kbuf[rows, :, pos] = key_states[i, :, j].to(self.kbuf.dtype)
            self.vbuf[rows, :, pos] = value_states[i, :, j].to(self.vbuf.dtype)

    def get_seq_length(self) -> int:
        return self.prefix_len

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.prefix_len + query_length, 0


def episode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, rlvr_episode=None, **kwargs):
    """transformers attention function: K new tokens per row (one in a decode step, a tool result's chunk) against
    (prompt once per group) + (the row's own written tokens). Any other call (the prefill) is SDPA."""
    layer = None if rlvr_episode is None else rlvr_episode.cache.layers[module.layer_idx]
    if not isinstance(layer, EpisodeLayer):
        return sdpa_cache_dtype(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    st, dtype = rlvr_episode, rlvr_episode.prefix_bias.dtype  # the scores' dtype: the buffers' or, bf16 buffers, fp32
    n, m = len(st.rows), len(st.read_rows)
    with torch.autocast(query.device.type, enabled=False):
        q = query.to(dtype)  # [n, Hq, K, D]
        if m != n:  # in place: a query for every row, the rows outside the forward left at zero
            q = q.new_zeros(m, *q.shape[1:]).index_copy_(0, st.rows, q)
        if st.native and q.shape[2] == 1 and layer.prefix_keys is None and dtype == torch.float32:
            out = _native(q, key, value, st.own_bias, scaling)  # [m, 1, Hq, D]
            return (out if m == n else out[st.rows]).to(query.dtype), None
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


def rotated_and_written(layer: "EpisodeLayer", q, k, v, rotary: tuple[torch.Tensor, torch.Tensor], st: EpisodeState) -> torch.Tensor:
    """q [n x K, Hq, D] rotated, with k rotated and k and v [n x K, Hkv, D] written at their slots (st.slot_at), in one C
    pass where it takes them (fp32 cos and sin: native_rotary's bits are rotate's and the index writes'), else torch's
    rotations and update's writes."""
    c_pass = st.slot_at is not None and rotary[0].dtype == rotary[1].dtype == torch.float32 and native_rotary.available()
    if c_pass and native_rotary.fits(q, k, v, layer.kbuf, layer.vbuf):
        assert st.slot_at is not None
        return native_rotary.rotate_and_write_at(q, k, v, *rotary, layer.kbuf, layer.vbuf, st.slot_at)
    q, k = rotate(q, *rotary), rotate(k, *rotary)
    assert st.write_pos is not None, "state.prepare() comes first"
    n, K = st.write_pos.shape
    layer.write(k.view(n, K, *k.shape[1:]).transpose(1, 2), v.view(n, K, *v.shape[1:]).transpose(1, 2))
    return q


def native_step(layer: "EpisodeLayer", q, k, v, scale: float, rotary: tuple[torch.Tensor, torch.Tensor], st: EpisodeState) -> torch.Tensor:
    """A forward's attention for lean_decode's step (st.step_native): q and k rotated, k and v written at each token's
    slot, and each token's attention over its row's slots up to its own, read in place: two C calls. q [n x K, Hq, D] and
    k, v [n x K, Hkv, D] as the products give them (not rotated). -> [n x K, Hq x D] fp32: in a one-token step what
    update() and episode_attention give, the same bits; in a chunk the same math in another order (rounding apart)."""
    assert st.query_rows is not None and st.lengths is not None and st.slot_bias is not None
    n, Hq, D = q.shape  # n: tokens, n x K
    Hkv = k.shape[1]
    with torch.autocast("cpu", enabled=False):
        q = rotated_and_written(layer, q, k, v, rotary, st).float().view(n, Hkv, Hq // Hkv, D)
        out, _ = native_attention(q, layer.kbuf, layer.vbuf, scale, st.slot_bias, st.length, st.query_rows, st.lengths)
    return out.view(n, Hq * D)


def _native(q, key, value, own_bias, scaling) -> torch.Tensor:
    """A one-token forward's attention in the repeated layout through the C kernel: q [m, Hq, 1, D] fp32 over each read
    row's buffers key / value [m, Hkv, L, D] (fp32 or bf16), own_bias [m, 1, 1, L]; [m, 1, Hq, D] as SDPA's."""
    m, Hq, _, D = q.shape
    Hkv, L = key.shape[1], key.shape[2]
    scale = D**-0.5 if scaling is None else scaling
    out, _ = native_attention(q.reshape(m, Hkv, Hq // Hkv, D), key, value, scale, own_bias, L)  # [m, Hkv, R, D]
    return out.view(m, 1, Hq, D)
