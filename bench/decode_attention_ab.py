"""The lean decode's attention on the CPU three ways, whole generations in one process, alternating:

    python bench/decode_attention_ab.py F 4     # a bench/floor.py config, 4 generations per way

  * explicit: rlvr.rollout.engines.hf.decode_attention with flash=False (two batched products and a softmax per part);
  * flash: SDPA's flash kernel for both parts, as the decode ran at 89e6039 (the shared layout's prompt part once per
    group, merged by log-sum-exp);
  * hybrid: the row's own tokens explicit, the prompt part through the flash kernel.
One Trainer on the config, one training step, then the same generation (prompts, seeds) per way; prints min,
median and every time, and each way's tokens and log-probs against the explicit way's.
"""

import statistics
import sys
import tempfile
import time
import types

import torch
import torch.nn.functional as F

import compare_trl
import floor
from rlvr.config import load_config
from rlvr.training import Trainer
import rlvr.rollout.engines.hf.lean_decode as ld
from rlvr.rollout.engines.hf import decode_attention as da

current = ld.decode_attention


def flash_both(q, k, v, own_k, own_v, t, bias, scale, prefix_k=None, prefix_v=None, rows=None, group_size=1, flash=False):
    n, Hkv, D = q.shape[0], own_k.shape[1], own_k.shape[-1]
    own_k[:, :, t] = k
    own_v[:, :, t] = v
    keys, values = own_k[:, :, : t + 1], own_v[:, :, : t + 1]
    rep = q.shape[1] // Hkv
    q = q.to(own_k.dtype)
    if prefix_k is None:
        out = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=bias[..., : t + 1], scale=scale, enable_gqa=rep > 1)
        return out.reshape(n, Hkv * rep * D)
    B, G = prefix_k.shape[0], group_size
    qr = q.view(n, Hkv, rep, D)
    o_own, lse_own = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qr, keys, values, 0.0, False, scale=scale)
    full = n == B * G
    qf = qr if full else qr.new_zeros(B * G, Hkv, rep, D).index_copy_(0, rows, qr)
    qf = qf.view(B, G, Hkv, rep, D).transpose(1, 2).reshape(B, Hkv, G * rep, D)
    o_p, lse_p = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qf, prefix_k, prefix_v, 0.0, False, attn_mask=bias, scale=scale)
    o_p = o_p.view(B, Hkv, G, rep, D).transpose(1, 2).reshape(B * G, Hkv, rep, D)
    lse_p = lse_p.view(B, Hkv, G, rep).transpose(1, 2).reshape(B * G, Hkv, rep)
    if not full:
        o_p, lse_p = o_p[rows], lse_p[rows]
    w = torch.sigmoid(lse_p - lse_own)[..., None]
    return torch.lerp(o_own, o_p, w).reshape(n, Hkv * rep * D)


def hybrid(q, k, v, own_k, own_v, t, bias, scale, prefix_k=None, prefix_v=None, rows=None, group_size=1, flash=False):
    """own part explicit, the prompt part through the flash kernel (its log-sum-exp comes with it)"""
    if prefix_k is None:
        return current(q, k, v, own_k, own_v, t, bias, scale)
    n, Hkv, D = q.shape[0], own_k.shape[1], own_k.shape[-1]
    own_k.select(2, t).copy_(k)
    own_v.select(2, t).copy_(v)
    keys, values = own_k.narrow(2, 0, t + 1), own_v.narrow(2, 0, t + 1)
    qr = q.to(own_k.dtype).view(n, Hkv, -1, D)
    rep = qr.shape[2]
    B, G = prefix_k.shape[0], group_size
    o_own, s_own = da._attend(qr, keys, values, scale)
    lse_own = torch.logsumexp(s_own, dim=-1)
    full = n == B * G
    qf = qr if full else qr.new_zeros(B * G, Hkv, rep, D).index_copy_(0, rows, qr)
    qf = qf.view(B, G, Hkv, rep, D).transpose(1, 2).reshape(B, Hkv, G * rep, D)
    o_p, lse_p = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qf, prefix_k, prefix_v, 0.0, False, attn_mask=bias, scale=scale)
    o_p = o_p.view(B, Hkv, G, rep, D).transpose(1, 2).reshape(B * G, Hkv, rep, D)
    lse_p = lse_p.view(B, Hkv, G, rep).transpose(1, 2).reshape(B * G, Hkv, rep)
    if not full:
        o_p, lse_p = o_p[rows], lse_p[rows]
    w = torch.sigmoid(lse_p - lse_own)[..., None]
    return torch.lerp(o_own, o_p, w).reshape(n, Hkv * rep * D)


ways = {"explicit": current, "flash": flash_both, "hybrid": hybrid}
ld.shared_flash_pays = lambda *a: False  # the step passes flash=False: each way runs as written
torch.set_num_threads(2)
name = sys.argv[1]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
a = types.SimpleNamespace(threads=2, warmup=1, steps=3)
spec = {**floor.make_spec(name, floor.build_inputs([name]), a), "out": tempfile.mkdtemp()}
tr = Trainer(load_config(None, compare_trl.rlvr_overrides(spec)), logger_live=False)
gen, call = tr.engine.generate, {}


def rec(p, pa, s):
    call.update(p=list(p), pa=pa, s=list(s))
    return gen(p, pa, s)


tr.engine.generate = rec
tr.train_step()
res = {k: [] for k in ways}
outs = {}
for i in range(reps):
    order = list(ways) if i % 2 == 0 else list(ways)[::-1]
    for w in order:
        ld.decode_attention = ways[w]
        t = time.perf_counter()
        o = gen(call["p"], call["pa"], call["s"])
        res[w].append(time.perf_counter() - t)
        outs[w] = o
for k, v in res.items():
    print(name, k, "min", round(min(v), 3), "median", round(statistics.median(v), 3), [round(x, 3) for x in v], flush=True)
ref = outs["explicit"]
for k, o in outs.items():
    print(
        name,
        k,
        "same tokens",
        torch.equal(o.completion_ids, ref.completion_ids),
        "max |dlogp|",
        float((o.sampling_logprobs - ref.sampling_logprobs).abs().max()),
    )
