"""The decode's C pass that rotates q and k and writes k and v into the KV buffers
(rlvr.rollout.engines.hf.native_rotary): torch's bits exactly (norm_rotary.rotate, then the slot's copies), for fp32
and bf16 inputs and buffers, views of a fused q/k/v output, strided buffers, every head size the kernel lays out and
others, one thread or several; and a lean decode through it draws the same tokens with the same log-probs as through
torch's ops."""

import pytest
import torch

import rlvr.rollout.engines.hf.native_rotary as native_rotary
from rlvr.models import native_build
from rlvr.models.norm_rotary import rotate, signed_sin

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _rotary(n: int, D: int):
    """cos and signed sin [n, 1, D] of positions spread over a long context, as the model's rotary gives them."""
    positions = torch.randint(0, 4000, (n,)).float()
    angles = positions[:, None] / 10000 ** (torch.arange(0, D, 2).float() / D)
    emb = torch.cat([angles, angles], -1)[:, None]
    return emb.cos(), signed_sin(emb.sin())


def _inputs(n: int, Hq: int, Hkv: int, D: int, dtype, fused: bool):
    """q [n, Hq, D], k, v [n, Hkv, D]: views of one product's output (fused), or each of its own."""
    if fused:
        qkv = (torch.randn(n, (Hq + 2 * Hkv) * D) * 3).to(dtype)
        q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], -1)
        return q.view(n, Hq, D), k.view(n, Hkv, D), v.view(n, Hkv, D)
    return [(torch.randn(n, H, D) * 3).to(dtype) for H in (Hq, Hkv, Hkv)]


@pytest.mark.parametrize("qkv", DTYPES)
@pytest.mark.parametrize("buffers", DTYPES)
@pytest.mark.parametrize("Hq, Hkv, D", [(8, 8, 64), (4, 2, 128), (6, 2, 40), (3, 1, 18), (2, 2, 256)])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "apart"])
def test_the_pass_gives_torchs_bits(qkv, buffers, Hq, Hkv, D, fused):
    assert native_rotary.available(), native_build.why_not(native_rotary.SOURCE)  # a compiler: CI's machines have one
    torch.manual_seed(D * Hq)
    n, S, t = 7, 12, 5
    q, k, v = _inputs(n, Hq, Hkv, D, DTYPES[qkv], fused)
    cos, sin = _rotary(n, D)
    # buffers as the decode holds them after a compaction and a grow: rows and slots strided, D contiguous
    own_k = torch.randn(2 * n, Hkv, S + 3, D).to(DTYPES[buffers])[::2, :, 1 : S + 1]
    own_v = torch.randn(n, Hkv + 1, S, D).to(DTYPES[buffers])[:, 1:]
    want_k, want_v = own_k.clone(), own_v.clone()
    want_k.select(2, t).copy_(rotate(k, cos, sin))
    want_v.select(2, t).copy_(v)

    got_q = native_rotary.rotate_and_write(q, k, v, cos, sin, own_k, own_v, t)

    assert got_q.dtype == torch.float32 and got_q.is_contiguous()
    assert torch.equal(got_q, rotate(q, cos, sin).float())
    assert torch.equal(own_k, want_k) and torch.equal(own_v, want_v)  # slot t, and no other slot touched


@pytest.mark.parametrize("buffers", DTYPES)
@pytest.mark.parametrize("Hq, Hkv, D", [(4, 4, 32), (4, 2, 64), (3, 1, 18)])
def test_rows_written_at_buffer_rows_and_slots_of_their_own(buffers, Hq, Hkv, D):
    """Multi-turn episodes: row i's k and v go to buffer row rows[i] at slot slots[i] (the episode cache's index_put),
    torch's bits, and nothing else in the buffers changes; a row at -1 (a chunk's padding) has its q rotated and
    writes nothing."""
    torch.manual_seed(D + Hkv)
    N, S = 9, 20
    rows, slots = torch.tensor([7, 0, 4, 8, 2]), torch.tensor([19, 0, 11, 3, 11])
    q, k, v = _inputs(len(rows), Hq, Hkv, D, torch.float32, fused=True)
    cos, sin = _rotary(len(rows), D)
    keys, values = (torch.randn(N, Hkv, S, D).to(DTYPES[buffers]) for _ in range(2))
    want_k, want_v = keys.clone(), values.clone()
    written = torch.tensor([0, 1, 2, 4])  # row 3: padding
    want_k[rows[written], :, slots[written]] = rotate(k, cos, sin)[written].to(want_k.dtype)
    want_v[rows[written], :, slots[written]] = v[written].to(want_v.dtype)
    at = native_rotary.slot_offsets(keys, rows, slots)
    at[3] = -1

    got_q = native_rotary.rotate_and_write_at(q, k, v, cos, sin, keys, values, at)

    assert torch.equal(got_q, rotate(q, cos, sin).float())
    assert torch.equal(keys, want_k) and torch.equal(values, want_v)
    with pytest.raises(AssertionError):  # a slot past the buffers is refused before the kernel writes it
        native_rotary.slot_offsets(keys, rows, slots + 1)


def test_inputs_of_mixed_dtypes():
    """qwen3 under autocast: q and k fp32 after its per-head norms, v bf16 from the product."""
    torch.manual_seed(2)
    n, Hq, Hkv, D, S, t = 5, 4, 2, 32, 6, 3
    q, k = torch.randn(n, Hq, D), torch.randn(n, Hkv, D)
    v = torch.randn(n, Hkv, D).to(torch.bfloat16)
    cos, sin = _rotary(n, D)
    own_k, own_v = torch.zeros(n, Hkv, S, D, dtype=torch.bfloat16), torch.zeros(n, Hkv, S, D, dtype=torch.bfloat16)
    got_q = native_rotary.rotate_and_write(q, k, v, cos, sin, own_k, own_v, t)
    assert torch.equal(got_q, rotate(q, cos, sin))
    assert torch.equal(own_k[:, :, t], rotate(k, cos, sin).to(torch.bfloat16)) and torch.equal(own_v[:, :, t], v)
    assert not native_rotary.fits(q, k, v, own_k, own_v.float())  # buffers of two dtypes
    assert not native_rotary.fits(q.half(), k, v, own_k, own_v)


def test_threads_give_the_same_bits():
    """Enough rows for the kernel's threads: the bits of one thread."""
    torch.manual_seed(1)
    n, Hq, Hkv, D, S, t = 300, 8, 4, 64, 4, 2
    q, k, v = _inputs(n, Hq, Hkv, D, torch.bfloat16, True)
    cos, sin = _rotary(n, D)
    outs = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            own_k, own_v = torch.zeros(n, Hkv, S, D, dtype=torch.bfloat16), torch.zeros(n, Hkv, S, D, dtype=torch.bfloat16)
            outs.append((native_rotary.rotate_and_write(q, k, v, cos, sin, own_k, own_v, t), own_k, own_v))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for out in outs[1:] for a, b in zip(outs[0], out))
    assert torch.equal(outs[0][1][:, :, t], rotate(k, cos, sin).to(torch.bfloat16))


def test_a_head_the_kernel_does_not_take_is_refused():
    q, k, v = (torch.randn(2, 1, 7) for _ in range(3))
    cos, sin = torch.ones(2, 1, 7), torch.zeros(2, 1, 7)
    with pytest.raises(AssertionError, match="odd or above"):
        native_rotary.rotate_and_write(q, k, v, cos, sin, torch.zeros(2, 1, 3, 7), torch.zeros(2, 1, 3, 7), 0)


def test_nan_inf_and_subnormals_round_as_torch_rounds_them():
    """A NaN key rounds to bf16 as torch rounds it (its vectorised cast: 0xffff), an infinity stays one, a float too
    large for bf16 rounds up to one, a subnormal stays one."""
    n, D = 2, 16
    k = torch.randn(n, 1, D)
    k[0, 0, 3], k[1, 0, 5], k[0, 0, 8], k[1, 0, 9], k[1, 0, 10] = float("nan"), float("inf"), 3.4e38, 1e-40, -3e-39
    cos, sin = torch.ones(n, 1, D), torch.zeros(n, 1, D)  # the rotation by 0: k itself
    own_k, own_v = torch.zeros(n, 1, 2, D, dtype=torch.bfloat16), torch.zeros(n, 1, 2, D, dtype=torch.bfloat16)
    native_rotary.rotate_and_write(torch.randn(n, 1, D), k, k, cos, sin, own_k, own_v, 1)
    want = rotate(k, cos, sin).to(torch.bfloat16)
    assert torch.equal(own_k[:, :, 1].view(torch.int16), want.view(torch.int16))
    assert torch.equal(own_v[:, :, 1].view(torch.int16), k.to(torch.bfloat16).view(torch.int16))
