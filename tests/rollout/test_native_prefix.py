"""The shared layout's prompt part and merge as one C kernel (rlvr.rollout.engines.hf.native_prefix) against the float64
attention over (prompt + own slots): fp32 and bf16 keys and values, head sizes the vectors do not divide and one over
eight vectors, prompts the key blocks do not divide, left padding whose keys and values hold NaN (not read), rows
compacted out, a group's queries over more than one work item; the same bits at any thread count."""

import pytest
import torch

import rlvr.rollout.engines.hf.native_prefix as native_prefix
from rlvr.models import native_build
from rlvr.rollout.engines.hf.native_attention import native_attention


def setup_module():
    assert native_prefix._kernels() is not None, native_build.why_not(native_prefix.SOURCE)  # CI's machines have a compiler


def _case(B, G, H, R, D, P, dtype, seed=0, t=5):
    """Queries, own buffers (slots 0..t written), the prompts (prompt 1 left-padded by 3, its padding's keys and values
    NaN), and the own part through native_attention."""
    g = torch.Generator().manual_seed(seed)
    n = B * G
    q = torch.randn(n, H, R, D, generator=g)
    own_k, own_v = (torch.randn(n, H, t + 4, D, generator=g).to(dtype) for _ in range(2))
    pk, pv = (torch.randn(B, H, P, D, generator=g).to(dtype) for _ in range(2))
    bias = torch.zeros(B, 1, 1, P)
    if B > 1:
        bias[1, ..., :3] = float("-inf")
        pk[1, :, :3], pv[1, :, :3] = float("nan"), float("nan")
    o_own, lse_own = native_attention(q, own_k, own_v, D**-0.5, None, t + 1)
    return q, own_k, own_v, pk, pv, bias, o_own, lse_own


def _truth(q, own_k, own_v, pk, pv, bias, rows, G, t):
    """float64 softmax over each row's prompt (its real slots) and own slots 0..t, [n, H, R, D]."""
    D = q.shape[-1]
    out = []
    for i, row in enumerate(rows.tolist()):
        b = row // G
        real = bias[b, 0, 0] == 0
        keys = torch.cat([pk[b][:, real].double(), own_k[i, :, : t + 1].double()], 1)  # [H, S, D]
        values = torch.cat([pv[b][:, real].double(), own_v[i, :, : t + 1].double()], 1)
        s = torch.einsum("hrd,hsd->hrs", q[i].double(), keys) * D**-0.5
        out.append(torch.einsum("hrs,hsd->hrd", s.softmax(-1), values))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "B, G, H, R, D, P",
    [(4, 16, 2, 4, 40, 259), (3, 8, 8, 1, 64, 70), (2, 3, 3, 3, 24, 37), (2, 4, 2, 2, 160, 33), (1, 2, 1, 5, 8, 1), (2, 2, 1, 1, 16, 64)],
)
def test_the_kernel_is_the_float64_attention(B, G, H, R, D, P, dtype):
    t = 5
    q, own_k, own_v, pk, pv, bias, o_own, lse_own = _case(B, G, H, R, D, P, dtype)
    rows = torch.arange(B * G)
    got = native_prefix.prefix_merged(q, native_prefix.transposed_keys(pk), pv, bias, rows, G, D**-0.5, o_own, lse_own)
    assert got.shape == q.shape and got.dtype == torch.float32 and not got.isnan().any()
    torch.testing.assert_close(got.double(), _truth(q, own_k, own_v, pk, pv, bias, rows, G, t), rtol=0, atol=2e-6)


@pytest.mark.parametrize("keep", [[0, 1, 4, 5, 6, 11], [7], [0, 2, 3, 5, 8, 9, 10, 11]])
def test_rows_compacted_out_attend_as_before(keep):
    """Rows left (ascending places among the groups): each attends to its own group's prompt, as with every row there."""
    B, G, H, R, D, P, t = 3, 4, 2, 3, 40, 50, 5
    q, own_k, own_v, pk, pv, bias, o_own, lse_own = _case(B, G, H, R, D, P, torch.float32, seed=1)
    kt, rows = native_prefix.transposed_keys(pk), torch.arange(B * G)
    every = native_prefix.prefix_merged(q, kt, pv, bias, rows, G, D**-0.5, o_own, lse_own)
    k = torch.tensor(keep)
    left = native_prefix.prefix_merged(q[k], kt, pv, bias, rows[k], G, D**-0.5, o_own[k], lse_own[k])
    assert torch.equal(left, every[k])  # each query computed alone: the same bits whoever else is there
    torch.testing.assert_close(left.double(), _truth(q[k], own_k[k], own_v[k], pk, pv, bias, rows[k], G, t), rtol=0, atol=2e-6)


def test_the_same_bits_at_any_thread_count():
    B, G, H, R, D, P = 4, 16, 2, 4, 40, 259
    q, _, _, pk, pv, bias, o_own, lse_own = _case(B, G, H, R, D, P, torch.float32, seed=2)
    args = (q, native_prefix.transposed_keys(pk), pv, bias, torch.arange(B * G), G, D**-0.5, o_own, lse_own)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(native_prefix.prefix_merged(*args))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_the_keys_transposed_in_blocks():
    k = torch.randn(2, 3, 45, 8)
    kt = native_prefix.transposed_keys(k)  # [B, H, Pp / KPAD, D, KPAD]
    KPAD = native_prefix.KPAD
    assert kt.shape == (2, 3, 2, 8, KPAD) and kt.is_contiguous()
    flat = kt.permute(0, 1, 2, 4, 3).reshape(2, 3, 2 * KPAD, 8)  # back to [B, H, Pp, D]
    assert torch.equal(flat[:, :, :45], k) and not flat[:, :, 45:].any()


def test_the_decode_takes_it_only_with_vectors():
    """available(): built here with AVX2 or AVX-512 (RLVR_NATIVE_MARCH's older builds: the generic C, still correct)."""
    assert native_prefix.available() == (native_prefix.vector_bits() >= 256)


def test_a_head_over_the_kernels_longest_is_refused():
    D = native_prefix.MAX_D + 8
    q, keys, bias = torch.zeros(2, 1, 1, D), torch.zeros(1, 1, 4, D), torch.zeros(1, 1, 1, 4)
    with pytest.raises(AssertionError, match="D"):
        native_prefix.prefix_merged(q, native_prefix.transposed_keys(keys), keys, bias, torch.arange(2), 2, 1.0, q, torch.zeros(2, 1, 1))
