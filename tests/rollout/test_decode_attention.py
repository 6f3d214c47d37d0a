"""The lean decode's CPU attention (rlvr.rollout.engines.hf.decode_attention): the shared layout through SDPA's flash
kernel equals the explicit products (float64 to 1e-12, with every row and with rows gone, from buffers read sliced or
whole), the repeated layout's whole buffers equal its sliced ones, bf16 buffers round only the keys, values and scores,
and which way a decode runs is timed once per machine and shapes, then read back from decode_attention.json."""

import json

import pytest
import torch

import rlvr.rollout.engines.hf.decode_attention as decode_attention_module
import rlvr.rollout.engines.hf.native_attention as native_attention
import rlvr.rollout.engines.hf.native_prefix as native_prefix
import rlvr.rollout.engines.hf.native_rotary as native_rotary
from rlvr.models import native_build
from rlvr.models.norm_rotary import rotate, signed_sin
from rlvr.rollout.engines.hf.decode_attention import SOFTMAX_MIN_KEYS, AttentionWay, _softmax, decode_attention, decode_attention_way
from rlvr.rollout.engines.hf.native_rotary import rotate_and_write

bf16, f32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize("keys", [1, 5, SOFTMAX_MIN_KEYS - 1, SOFTMAX_MIN_KEYS, 40])
def test_softmax_over_few_keys_is_torchs_softmax(keys):
    """decode_attention._softmax pads fewer than SOFTMAX_MIN_KEYS keys with -inf (a faster kernel on the CPU): the same
    weights as torch.softmax, masked keys (-inf and the finite masks the caches use) included, shape unchanged."""
    torch.manual_seed(0)
    s = torch.randn(3, 2, 7, keys, dtype=torch.float64) * 4
    s[0, :, :, 0] = float("-inf")
    s[1, :, :, -1] = torch.finfo(torch.float64).min
    s[..., 0] = s[..., 0] if keys > 1 else 0.0  # one key: nothing masked
    p = _softmax(s)
    assert p.shape == s.shape
    torch.testing.assert_close(p, torch.softmax(s, -1), rtol=0, atol=1e-15)
    f32 = s.float()
    torch.testing.assert_close(_softmax(f32), torch.softmax(f32, -1), rtol=0, atol=1e-6)


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


def test_the_way_is_chosen_by_timing_once_per_machine_and_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_PRECISION_CACHE", str(tmp_path / "precision.json"))
    monkeypatch.setattr(decode_attention_module, "_CHOICES", {})
    timed = []

    def timing(B, G, Hq, Hkv, D, P, T, dtype, layouts, lower, layers, repeated_flash, native, prefix_kernel):
        timed.append((B, G, P, T, layouts, lower, layers, repeated_flash))
        return {"shared": layouts[-1] and P >= 96, "flash": P >= 256, "lower": lower is not None and P < 64, "native": native}

    monkeypatch.setattr(decode_attention_module, "_time_ways", timing)
    f32, bf16 = torch.float32, torch.bfloat16
    way = decode_attention_way(4, 16, 8, 2, 40, 259, 48, f32, shared=True, layers=8)  # buckets 512, 64
    assert way == AttentionWay(f32, True, True) and timed[-1] == (4, 16, 512, 64, (True,), None, 8, True)
    assert decode_attention_way(4, 16, 8, 2, 40, 300, 60, f32, shared=True, layers=8).flash and len(timed) == 1  # the same buckets
    assert decode_attention_way(4, 16, 8, 2, 40, 100, 48, f32, shared=True, layers=8) == AttentionWay(f32, False, True)
    # the repeated layout: the flash kernel timed against the products, unless the caller cannot run it (the episodes'
    # attention): then nothing to choose in the buffers' own dtype; under bf16 autocast bf16 buffers are timed
    no_flash = dict(shared=False, layers=8, repeated_flash=False)
    assert decode_attention_way(8, 8, 8, 8, 64, 12, 64, f32, **no_flash) == AttentionWay(f32, False, False) and len(timed) == 2
    assert decode_attention_way(8, 8, 8, 8, 64, 300, 64, f32, shared=False, layers=8) == AttentionWay(f32, True, False)
    assert timed[-1] == (8, 8, 512, 64, (False,), None, 8, True)
    assert decode_attention_way(8, 8, 8, 8, 64, 12, 64, f32, lower=bf16, **no_flash) == AttentionWay(bf16, False, False)
    assert timed[-1] == (8, 8, 16, 64, (False,), bf16, 8, False)
    # either layout: both timed at the prompt's length to a multiple of 16 (48, 112), the answer's
    assert decode_attention_way(4, 16, 8, 2, 40, 40, 48, f32, shared=None, layers=8) == AttentionWay(f32, False, False)
    assert decode_attention_way(4, 16, 8, 2, 40, 100, 48, f32, shared=None, layers=8) == AttentionWay(f32, False, True)
    assert [(t[2], t[4]) for t in timed[-2:]] == [(48, (False, True)), (112, (False, True))]
    monkeypatch.setattr(decode_attention_module, "_CHOICES", {})  # a new process on this machine: read back
    assert decode_attention_way(4, 16, 8, 2, 40, 259, 48, f32, shared=True, layers=8).flash and len(timed) == 6
    entries = [(json.loads(k), e) for k, e in json.loads((tmp_path / "decode_attention.json").read_text()).items()]
    assert sorted((k["layout"], k["prompt"], k["lower"]) for k, _ in entries) == [
        ("either", 48, "none"), ("either", 112, "none"), ("repeated", 16, "bfloat16"), ("repeated", 512, "none"),
        ("shared", 128, "none"), ("shared", 512, "none"),
    ]  # fmt: skip
    key = next(k for k, e in entries if k["prompt"] == 512)
    assert (key["groups"], key["group_size"], key["q_heads"], key["kv_heads"], key["head_dim"], key["capacity"], key["dtype"]) == (
        4, 16, 8, 2, 40, 64, "float32"
    )  # fmt: skip
    assert key["threads"] == torch.get_num_threads() and key["cpu"] and key["torch"] == torch.__version__ and key["layers"] == 8
    assert key["explicit"] == 4  # the explicit products' version: an answer timed against older ones is timed again
    assert key["repeated_flash"] == 1 and next(k for k, e in entries if k["lower"] == "bfloat16")["repeated_flash"] == 0


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("shared", [True, False, None], ids=["shared", "repeated", "either"])
def test_the_timing_runs_every_way_on_this_machine(tmp_path, monkeypatch, shared, native):
    """Every way timed on this machine (the C kernel's where the caller runs it), and the choice made by the rules."""
    monkeypatch.setenv("RLVR_PRECISION_CACHE", str(tmp_path / "precision.json"))
    monkeypatch.setattr(decode_attention_module, "_CHOICES", {})
    assert native_attention.available(), native_build.why_not(native_attention.SOURCE)  # a compiler: CI's machines have one
    way = decode_attention_way(2, 4, 4, 2, 16, 40, 16, torch.float32, shared=shared, lower=torch.bfloat16, layers=3, native=native)
    ((key, entry),) = json.loads((tmp_path / "decode_attention.json").read_text()).items()
    # answers timed without the kernel (or with another version of it) are not read for it
    assert json.loads(key).get("native") == (decode_attention_module.NATIVE_VERSION if native else None)
    layouts = {True: ["shared"], False: ["repeated"], None: ["repeated", "shared"]}[shared]
    # the shared prompt through native_prefix's kernel: timed too where it builds with AVX2 or AVX-512
    prefix = native and "shared" in layouts and native_prefix.available()
    assert json.loads(key).get("prefix") == (decode_attention_module.PREFIX_VERSION if prefix else None)
    names = [f"{layout}{way}_s" for layout in layouts for way in ("", "_lower", "_flash")]
    if native:
        names += [f"{layout}{way}_s" for layout in layouts for way in ("_native", "_lower_native")]
        names += ["shared_native_flash_s"] if "shared" in layouts else []
    if prefix:
        names += ["shared_native_prefix_s", "shared_lower_native_prefix_s"]
    assert sorted(n for n in entry if n.endswith("_s")) == sorted(names) and all(0 < entry[n] < 0.1 for n in names)
    rules = decode_attention_module
    # the fp32 way of the least time, the flash kernel's handicapped by FLASH_AT_MOST; bf16 at LOWER_AT_MOST of that (the C
    # kernels' bf16, in the repeated layout or for both shared parts, at LOWER_NATIVE_AT_MOST: they round only the keys and
    # values)
    exact = {n: entry[n] / (rules.FLASH_AT_MOST if "flash" in n else 1) for n in names if "lower" not in n}
    best = min(exact, key=exact.__getitem__)
    near = ("repeated_lower_native_s", "shared_lower_native_prefix_s")
    share = {n: rules.LOWER_NATIVE_AT_MOST if n in near else rules.LOWER_AT_MOST for n in names if "lower" in n}
    lowered = min(share, key=lambda n: entry[n] / share[n])
    chosen = lowered if entry[lowered] <= share[lowered] * entry[best] else best
    dtype = torch.bfloat16 if "lower" in chosen else torch.float32
    expected = AttentionWay(dtype, "flash" in chosen, chosen.startswith("shared"), "native" in chosen, "prefix" in chosen)
    assert way == expected
    got = (entry["shared"], entry["flash"], entry["lower"], entry["native"], entry["native_prefix"])
    assert got == (expected.shared, expected.flash, "lower" in chosen, expected.native, expected.native_prefix)


def test_the_kernel_is_not_timed_where_it_cannot_run(tmp_path, monkeypatch):
    """Buffers other than fp32 (a float64 model), or no kernel on this machine (RLVR_NATIVE=off here): the torch ways."""
    monkeypatch.setenv("RLVR_PRECISION_CACHE", str(tmp_path / "precision.json"))
    monkeypatch.setattr(decode_attention_module, "_CHOICES", {})
    f64 = decode_attention_way(2, 4, 4, 2, 16, 40, 16, torch.float64, shared=False, layers=1, native=True)
    assert not f64.native and f64.dtype == torch.float64
    monkeypatch.setenv("RLVR_NATIVE", "off")
    native_build.load.cache_clear()
    native_attention._kernels.cache_clear()
    try:
        assert not native_attention.available() and native_build.why_not(native_attention.SOURCE) == "RLVR_NATIVE=off"
        way = decode_attention_way(2, 4, 4, 2, 16, 40, 16, torch.float32, shared=True, layers=1, native=True)
        assert not way.native
    finally:
        native_build.load.cache_clear()
        native_attention._kernels.cache_clear()
    entries = json.loads((tmp_path / "decode_attention.json").read_text())
    assert len(entries) == 2 and all("native" not in json.loads(k) and not e["native"] for k, e in entries.items())
    assert not [n for e in entries.values() for n in e if "native" in n and n.endswith("_s")]  # no kernel way timed


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "repeated"])
@pytest.mark.parametrize("rows_left", [None, [0, 2, 3, 7]])
def test_bf16_buffers_round_keys_and_scores_only(shared, rows_left):
    """Buffers in bf16 under an fp32 query (bf16 autocast's decode where that was timed faster): the products in bf16
    (their inputs and outputs rounded to bf16: query, keys, values, scores, weights, each part's output), the rest in
    fp32. The output is that computation in float64 up to a rounding flipped by the products' fp32 sums (5e-3), closer
    than the float64 attention over the rounded inputs is (1e-2); the new token's keys/values are written rounded."""
    torch.manual_seed(0)
    B, G, Hq, Hkv, D, P, T, t = 2, 4, 6, 2, 16, 11, 9, 5
    rows = torch.arange(B * G) if rows_left is None else torch.tensor(rows_left)
    n, f64, bf16, scale = rows.numel(), torch.float64, torch.bfloat16, 16**-0.5
    q, k, v = torch.randn(n, Hq, D) * 2, torch.randn(n, Hkv, D) * 2, torch.randn(n, Hkv, D)
    pk, pv = torch.randn(B, Hkv, P, D) * 2, torch.randn(B, Hkv, P, D)
    own = torch.randn(2, n, Hkv, T, D)
    own[0] *= 2
    own[..., t + 1 :, :] = 0
    own_k, own_v = own.to(bf16)
    if shared:
        bias, own_bias = torch.zeros(B, 1, 1, P), torch.zeros(1, 1, 1, T)
        bias[1, ..., :3] = float("-inf")  # the second prompt left-padded by 3
        own_bias[..., t + 1 :] = float("-inf")
        out = decode_attention(q, k, v, own_k, own_v, t, bias, scale, pk.to(bf16), pv.to(bf16), rows, G, own_bias, True)
    else:  # each row's buffer holds its prompt's keys first (slots 0..P-1 of P + T)
        own_k = torch.cat([pk.to(bf16)[rows // G], own_k], 2)
        own_v = torch.cat([pv.to(bf16)[rows // G], own_v], 2)
        bias = torch.zeros(n, 1, 1, P + T)
        bias[(rows // G == 1).nonzero()[:, 0], ..., :3] = float("-inf")
        bias[..., P + t + 1 :] = float("-inf")
        out = decode_attention(q, k, v, own_k, own_v, P + t, bias, scale, None, None, None, 1, None, True)
        own_k, own_v = own_k[:, :, P:], own_v[:, :, P:]
    assert torch.equal(own_k[:, :, t], k.to(bf16)) and torch.equal(own_v[:, :, t], v.to(bf16))
    r, errors = Hq // Hkv, {}
    rounded = lambda x: x.to(bf16).to(f64)  # noqa: E731
    for i, row in enumerate(rows.tolist()):
        b = row // G
        own_keys = own[0][i, :, : t + 1].index_copy(1, torch.tensor([t]), k[i][:, None])
        own_values = own[1][i, :, : t + 1].index_copy(1, torch.tensor([t]), v[i][:, None])
        prompt_mask = torch.cat([torch.full((3,), float("-inf")) if b == 1 else torch.zeros(3), torch.zeros(P - 3)]).to(f64)
        parts = [(pk[b], pv[b], prompt_mask), (own_keys, own_values, torch.zeros(t + 1, dtype=f64))]
        if not shared:  # one softmax over the prompt's and the row's slots
            parts = [tuple(torch.cat(x, -2 if x[0].dim() > 1 else -1) for x in zip(*parts))]
        for emulated in (True, False):  # the bf16 way's roundings, or the float64 attention over the rounded inputs
            outs, lses = [], []
            for keys, values, mask in parts:
                s = torch.einsum("hd,hkd->hk", rounded(q[i]), rounded(keys).repeat_interleave(r, 0))
                s = (rounded(s) if emulated else s) * scale + mask
                p = s.softmax(-1)
                o = torch.einsum("hk,hkd->hd", rounded(p) if emulated else p, rounded(values).repeat_interleave(r, 0))
                outs.append(rounded(o) if emulated else o)
                lses.append(s.logsumexp(-1))
            weights = torch.stack(lses).softmax(0)[..., None]  # the parts merged by their log-sum-exps
            truth = (weights * torch.stack(outs)).sum(0).reshape(-1)
            errors[emulated] = max(errors.get(emulated, 0.0), float((out[i].to(f64) - truth).abs().max()))
    assert errors[True] < 5e-3 and errors[False] > 1e-2, errors  # (on an AMD EPYC: 3e-7 or 0, and 0.018-0.025)


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


@pytest.mark.parametrize("whole", [False, True], ids=["sliced", "whole"])
@pytest.mark.parametrize("Hq, Hkv", [(4, 4), (6, 2)])
def test_repeated_layout_through_the_flash_kernel_equals_the_explicit_products(Hq, Hkv, whole):
    """The repeated layout (prompt and own tokens in each row's buffer) through SDPA's flash kernel, as
    decode_attention_way may choose for it: the explicit products' output (float64, 1e-12), from buffers read to slot t
    or read whole with the slots after t masked, left padding included; the token's keys/values written either way."""
    torch.manual_seed(3)
    n, D, S, t, f64 = 5, 8, 14, 9, torch.float64
    q, k, v = torch.randn(n, Hq, D, dtype=f64), torch.randn(n, Hkv, D, dtype=f64), torch.randn(n, Hkv, D, dtype=f64)
    own = torch.randn(2, n, Hkv, S, D, dtype=f64)
    bias = torch.zeros(n, 1, 1, S, dtype=f64)
    bias[1, ..., :2] = float("-inf")  # left padding
    if whole:
        bias[..., t + 1 :] = float("-inf")
    outs = []
    for flash in (False, True):
        own_k, own_v = own[0].clone(), own[1].clone()
        outs.append(decode_attention(q, k, v, own_k, own_v, t, bias, D**-0.5, None, None, None, 1, None, whole, flash=flash))
        assert torch.equal(own_k[:, :, t], k) and torch.equal(own_v[:, :, t], v)
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=1e-12)


# (shared layout, flash kernel, q's dtype, the buffers'): the flash kernel takes no bf16 buffers with fp32 queries
# (decode_attention_way never pairs them)
DTYPES = ((bf16, f32), (f32, f32), (bf16, bf16))
ROTARY_WAYS = [(s, f, q, b) for s in (True, False) for f in (True, False) for q, b in DTYPES if not (f and b == bf16)]


@pytest.mark.parametrize("shared, flash, q_dtype, buffers", ROTARY_WAYS)
def test_every_way_rotates_through_the_c_pass_with_torchs_bits(shared, flash, q_dtype, buffers, monkeypatch):
    """decode_attention given (cos, sin) rotates q and k and writes k, v through native_rotary's pass whichever way the
    attention runs (flash, explicit; either layout): the output and the buffers those of rotating in torch first, bit for
    bit. A bf16 cos (a model run in bf16) keeps torch's rotation, in bf16."""
    assert native_rotary.available(), native_build.why_not(native_rotary.SOURCE)  # a compiler: CI's machines have one
    calls = []
    monkeypatch.setattr(native_rotary, "rotate_and_write", lambda *a: calls.append(a[3].dtype) or rotate_and_write(*a))
    torch.manual_seed(4)
    B, G, Hq, Hkv, D, P, T, t = 2, 3, 6, 2, 16, 7, 9, 4
    n = B * G
    q, k, v = (torch.randn(n, h, D).to(q_dtype) for h in (Hq, Hkv, Hkv))
    angle = torch.rand(n, 1, D // 2) * 50
    cos = torch.cat([angle.cos(), angle.cos()], -1)
    sin_signed = signed_sin(torch.cat([angle.sin(), angle.sin()], -1))
    own = torch.randn(2, n, Hkv, T, D).to(buffers)
    if shared:
        pk, pv, rows = torch.randn(B, Hkv, P, D).to(buffers), torch.randn(B, Hkv, P, D).to(buffers), torch.arange(n)
        bias, own_bias = torch.zeros(B, 1, 1, P), torch.zeros(1, 1, 1, T)
        own_bias[..., t + 1 :] = float("-inf")
        tail = (bias, D**-0.5, pk, pv, rows, G, own_bias, True)
    else:
        bias = torch.zeros(n, 1, 1, T)
        bias[..., t + 1 :] = float("-inf")
        tail = (bias, D**-0.5, None, None, None, 1, None, True)
    for c, s in ((cos, sin_signed), (cos.bfloat16(), sin_signed.bfloat16())):
        got_k, got_v, want_k, want_v = own[0].clone(), own[1].clone(), own[0].clone(), own[1].clone()
        got = decode_attention(q, k, v, got_k, got_v, t, *tail, flash=flash, rotary=(c, s))
        want = decode_attention(rotate(q, c, s), rotate(k, c, s), v, want_k, want_v, t, *tail, flash=flash)
        assert got.dtype == want.dtype and torch.equal(got, want)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert calls == [torch.float32]  # the pass ran for the fp32 cos, not for the bf16 one
