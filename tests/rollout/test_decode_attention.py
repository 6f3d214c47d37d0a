"""The lean decode's CPU attention (rlvr.rollout.engines.hf.decode_attention): the shared layout through SDPA's flash
kernel equals the explicit products (float64 to 1e-12, with every row and with rows gone, from buffers read sliced or
whole), the repeated layout's whole buffers equal its sliced ones, and which of the two a
decode runs is timed once per machine and shapes, then read back from decode_attention.json."""

import json

import pytest
import torch

import rlvr.rollout.engines.hf.decode_attention as decode_attention_module
from rlvr.rollout.engines.hf.decode_attention import decode_attention, shared_flash_pays


@pytest.mark.parametrize("rows_left", [None, [0, 2, 3, 7]])
@pytest.mark.parametrize("Hq, Hkv", [(4, 4), (6, 2)])
@pytest.mark.parametrize("whole", [False, True], ids=["sliced", "whole"])
def test_shared_layout_through_the_flash_kernel_equals_the_explicit_products(rows_left, Hq, Hkv, whole):
    """Either way, from buffers read up to slot t or read whole with the slots after t zero and masked."""
    torch.manual_seed(0)
    B, G, D, P, T, t = 2, 4, 8, 11, 9, 5
    rows = torch.arange(B * G) if rows_left is None else torch.tensor(rows_left)
    n, f64 = rows.numel(), torch.float64
    q, k, v = torch.randn(n, Hq, D, dtype=f64), torch.randn(n, Hkv, D, dtype=f64), torch.randn(n, Hkv, D, dtype=f64)
    own = torch.randn(2, n, Hkv, T, D, dtype=f64)
    own_bias = None
    if whole:  # as lean_decode.DecodeState keeps them: unwritten slots zero, masked
        own[..., t + 1 :, :] = 0
        own_bias = torch.zeros(1, 1, 1, T, dtype=f64)
        own_bias[..., t + 1 :] = float("-inf")
    pk, pv = torch.randn(B, Hkv, P, D, dtype=f64), torch.randn(B, Hkv, P, D, dtype=f64)
    bias = torch.zeros(B, 1, 1, P, dtype=f64)
    bias[1, ..., :3] = float("-inf")  # the second prompt left-padded by 3
    outs = {}
    for flash in (False, True):
        own_k, own_v = own[0].clone(), own[1].clone()
        outs[flash] = decode_attention(q, k, v, own_k, own_v, t, bias, D**-0.5, pk, pv, rows, G, own_bias, whole, flash=flash)
        assert torch.equal(own_k[:, :, t], k) and torch.equal(own_v[:, :, t], v)  # written either way
    # the truth: each row's softmax over its prompt's real keys and its own slots 0..t
    r = Hq // Hkv
    for i, row in enumerate(rows.tolist()):
        keys = torch.cat([pk[row // G], own[0][i, :, : t + 1].clone().index_copy_(1, torch.tensor([t]), k[i][:, None])], 1)
        values = torch.cat([pv[row // G], own[1][i, :, : t + 1].clone().index_copy_(1, torch.tensor([t]), v[i][:, None])], 1)
        s = torch.einsum("hd,hkd->hk", q[i], keys.repeat_interleave(r, 0)) * D**-0.5 + torch.cat(
            [bias[row // G, 0, 0], torch.zeros(t + 1, dtype=f64)]
        )
        truth = torch.einsum("hk,hkd->hd", s.softmax(-1), values.repeat_interleave(r, 0)).reshape(-1)
        for flash in (False, True):
            torch.testing.assert_close(outs[flash][i], truth, rtol=0, atol=1e-12)


def test_the_kernel_is_chosen_by_timing_once_per_machine_and_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_PRECISION_CACHE", str(tmp_path / "precision.json"))
    monkeypatch.setattr(decode_attention_module, "_CHOICES", {})
    timed = []

    def timing(B, G, Hq, Hkv, D, P, T, dtype):
        timed.append((B, G, P, T))
        return {"flash": P >= 256, "flash_s": 1.0, "explicit_s": 1.0}

    monkeypatch.setattr(decode_attention_module, "_time_shared", timing)
    assert shared_flash_pays(4, 16, 8, 2, 40, 259, 48, torch.float32)  # prompt bucket 512, capacity 64
    assert shared_flash_pays(4, 16, 8, 2, 40, 300, 60, torch.float32) and len(timed) == 1  # the same buckets
    assert not shared_flash_pays(4, 16, 8, 2, 40, 100, 48, torch.float32) and timed[-1] == (4, 16, 128, 64)
    monkeypatch.setattr(decode_attention_module, "_CHOICES", {})  # a new process on this machine: read back
    assert shared_flash_pays(4, 16, 8, 2, 40, 259, 48, torch.float32) and len(timed) == 2
    entries = {json.loads(k)["prompt"]: (json.loads(k), e) for k, e in json.loads((tmp_path / "decode_attention.json").read_text()).items()}
    assert sorted(entries) == [128, 512] and entries[512][1]["flash"] and not entries[128][1]["flash"]
    key = entries[512][0]
    assert (key["groups"], key["group_size"], key["q_heads"], key["kv_heads"], key["head_dim"], key["capacity"], key["dtype"]) == (
        4, 16, 8, 2, 40, 64, "float32"
    )  # fmt: skip
    assert key["threads"] == torch.get_num_threads() and key["cpu"] and key["torch"] == torch.__version__
    assert key["explicit"] == 2  # the explicit products' version: an answer timed against older ones is timed again


def test_the_timing_runs_both_ways_on_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_PRECISION_CACHE", str(tmp_path / "precision.json"))
    monkeypatch.setattr(decode_attention_module, "_CHOICES", {})
    flash = shared_flash_pays(2, 4, 4, 2, 16, 40, 16, torch.float32)
    ((_, entry),) = json.loads((tmp_path / "decode_attention.json").read_text()).items()
    assert 0 < entry["flash_s"] < 0.1 and 0 < entry["explicit_s"] < 0.1
    assert flash == entry["flash"] == (entry["flash_s"] <= decode_attention_module.FLASH_AT_MOST * entry["explicit_s"])


def test_repeated_layout_whole_buffers_equal_sliced_ones():
    """Repeated layout: the buffer read whole, slots after t zero and masked by the bias, equals it read to slot t
    (float64, 1e-12), left padding included."""
    torch.manual_seed(1)
    n, H, D, S, t = 5, 4, 8, 12, 7
    q, k, v = (torch.randn(n, H, D, dtype=torch.float64) for _ in range(3))
    own = torch.randn(2, n, H, S, D, dtype=torch.float64)
    bias = torch.zeros(n, 1, 1, S, dtype=torch.float64)
    bias[1, ..., :2] = float("-inf")  # left padding
    sliced = decode_attention(q, k, v, own[0].clone(), own[1].clone(), t, bias, D**-0.5)
    own[..., t + 1 :, :] = 0
    masked = bias.clone()
    masked[..., t + 1 :] = float("-inf")
    whole = decode_attention(q, k, v, own[0].clone(), own[1].clone(), t, masked, D**-0.5, None, None, None, 1, None, True)
    torch.testing.assert_close(whole, sliced, rtol=0, atol=1e-12)
