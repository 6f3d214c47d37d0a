"""The lean decode's attention on the CPU three ways, whole generations in one process, alternating:

    python bench/decode_attention_ab.py F 4     # a bench/floor.py config, 4 generations per way

  * explicit: rlvr.rollout.engines.hf.decode_attention with flash=False (two batched products and a softmax per part);
  * flash: SDPA's flash kernel for both parts, as the decode ran at 89e6039 (the shared layout's prompt part once per
    group, merged by log-sum-exp);
  * hybrid: the row's own tokens explicit, the prompt part through the flash kernel.
bench/generation_ab.py runs the ways; prints min, median and every time, and each way's tokens and log-probs against
the explicit way's.
"""

import sys

import torch
import torch.nn.functional as F

import rlvr.rollout.engines.hf.lean_decode as ld
from generation_ab import generation_ab
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
    o_own, s_own = da.attend(qr, keys, values, scale)
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


def main() -> None:
    name, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
    ld.decode_attention_way = lambda *a, **kw: da.AttentionWay(
        a[7], False, kw["shared"] is not False
    )  # the step passes flash=False: each way runs as written
    functions = {"explicit": current, "flash": flash_both, "hybrid": hybrid}
    ways = {w: (lambda f=f: setattr(ld, "decode_attention", f)) for w, f in functions.items()}
    _, outputs, _ = generation_ab(name, ways, reps)
    ref = outputs["explicit"][-1]
    for way, outs in outputs.items():
        same = torch.equal(outs[-1].completion_ids, ref.completion_ids)
        print(f"{way}: same tokens {same}, max |d logp| {float((outs[-1].sampling_logprobs - ref.sampling_logprobs).abs().max()):.2e}")


if __name__ == "__main__":
    main()
