"""The multi-turn episodes' attention (shared_prefix.attend_prefix_and_own) as it was, with a hand-written softmax
per part and a merge of ten elementwise ops, against as it is, each part's softmax and log-sum-exp by
decode_attention.attend_with_lse (the single-turn decode's) and the merge by a sigmoid and a lerp; whole batches of
episodes in one process, bench/episodes_chunks_ab.py's batch and driver (tool results as chunks through the lean step):

    python bench/episode_attention_ab.py src/rlvr/models/tiny-tools 240 fp32   # a model folder, new tokens, fp32|bf16

The ways alternate, 7 batches each (the first one's time left out of the medians); the tokens should agree but for
rare near-ties of the sampler's inverse CDF (the two round differently, ~1e-7).
"""

from __future__ import annotations

import sys

import torch

from _episodes import QUESTIONS, Answering, alternate, report
from _report import cpu_name
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.models.precision import autocast_context
from rlvr.rollout import SamplingParams
from rlvr.rollout.engines.hf import HFEngine, episode_cache


def before(query, key, value, prefix_keys, prefix_values, *, rows, group_size: int, prefix_bias, scaling=None, own_bias=None):
    """attend_prefix_and_own at 3ad1c4e (fe11a90), unchanged."""
    n, Hq, K, D = query.shape
    Hkv = key.shape[1]
    rep = Hq // Hkv
    qr = rep * K
    scale = scaling if scaling is not None else D**-0.5
    q = query.reshape(n, Hkv, qr, D)
    B, G = prefix_keys.shape[0], group_size
    full = n == B * G
    qf = q
    if not full:
        qf = q.new_zeros(B * G, Hkv, qr, D)
        qf[rows] = q
    qf = qf.view(B, G, Hkv, qr, D).transpose(1, 2).reshape(B, Hkv, G * qr, D)
    s = torch.matmul(qf, prefix_keys.transpose(-1, -2)) * scale + prefix_bias
    m_p = s.amax(-1, keepdim=True)
    e = torch.exp(s - m_p)
    l_p, o_p = e.sum(-1, keepdim=True), torch.matmul(e, prefix_values)

    def per_row(x):
        X = x.shape[-1]
        x = x.view(B, Hkv, G, qr, X).transpose(1, 2).reshape(B * G, Hkv, qr, X)
        return x if full else x[rows]

    m_p, l_p, o_p = per_row(m_p), per_row(l_p), per_row(o_p)
    s = torch.matmul(q, key.transpose(-1, -2)) * scale
    if own_bias is not None:
        s = s + (own_bias if K == 1 else own_bias.repeat(1, 1, rep, 1))
    m_s = s.amax(-1, keepdim=True)
    e = torch.exp(s - m_s)
    l_s, o_s = e.sum(-1, keepdim=True), torch.matmul(e, value)
    m = torch.maximum(m_p, m_s)
    a, b = torch.exp(m_p - m), torch.exp(m_s - m)
    out = (o_p * a + o_s * b) / (l_p * a + l_s * b)
    return out.view(n, Hq, K, D).transpose(1, 2)


def main() -> None:
    path, new_tokens, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(2)
    tok, _ = load_tokenizer(path)
    model = load_model(path).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False) for q in QUESTIONS]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)  # episodes of the whole budget
    after = episode_cache.attend_prefix_and_own

    def run():
        with autocast_context("none" if precision == "fp32" else precision, torch.device("cpu"), model):
            return HFEngine(model, tok).generate_episodes(prompts, params, list(range(len(prompts))), Answering(tok))[2]

    ways = {"before": lambda: setattr(episode_cache, "attend_prefix_and_own", before),
            "after": lambda: setattr(episode_cache, "attend_prefix_and_own", after)}  # fmt: skip
    seconds, traces = alternate(ways, run)
    print(f"{cpu_name()}, torch {torch.__version__}, 2 threads, {precision}; {path}, {len(prompts)} x 8 episodes, {new_tokens} new tokens")
    report(seconds)
    same = sum(a.ids == b.ids for a, b in zip(traces["before"], traces["after"]))
    pairs = [(a, b) for a, b in zip(traces["before"], traces["after"]) if a.ids == b.ids]
    logp = max((abs(x - y) for a, b in pairs for x, y in zip(a.logps, b.logps)), default=0.0)
    print(f"the same tokens in {same} of {len(traces['after'])} episodes (largest log-prob difference there {logp:.1e})")


if __name__ == "__main__":
    main()
