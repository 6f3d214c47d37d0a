"""Tiny transformers causal LMs and a completion batch for the training-forward tests: real models (two layers,
grouped-query attention) that run forward and backward in milliseconds, built under a fixed seed, and prompts with
left padding and completions with right padding, as the trainer hands them to rlvr.models.forward."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

KINDS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),  # q/k/v with a bias
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),  # q and k normed per head after their products
}


def tiny_lm(kind: str = "llama", seed: int = 0, **shape):
    """A `kind` model with 61 tokens, 2 layers of 48 wide, 6 query heads over 2 kv heads, unless `shape` says otherwise."""
    config, model = KINDS[kind]
    sizes = dict(vocab_size=61, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6)
    sizes.update(num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return model(config(**{**sizes, **shape}))


def completion_batch(vocab: int = 61):
    """(prompt [6, 7], its mask, completion [6, 5], its mask): two prompts left-padded, one completion ended early."""
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, vocab, (6, 7), generator=g)
    prompt_mask = torch.ones_like(prompt)
    prompt_mask[1, :3] = 0
    prompt_mask[4, :2] = 0
    completion = torch.randint(3, vocab, (6, 5), generator=g)
    completion_mask = torch.ones_like(completion)
    completion_mask[2, 3:] = 0
    return prompt, prompt_mask, completion, completion_mask


def grouped_batch(G: int = 3, P: int = 7, C: int = 6, seed: int = 1, vocab: int = 50):
    """(prompt [3 G, P], its mask, completion [3 G, C], its mask, group ids [3 G]): three prompts left-padded by 0, 3
    and 1, each repeated for its group's G rows, completions right-padded to random lengths (the shared-prefix forward's
    input)."""
    g = torch.Generator().manual_seed(seed)
    p_ids, p_mask = torch.zeros(3, P, dtype=torch.long), torch.zeros(3, P, dtype=torch.long)
    for i, n in enumerate([P, P - 3, P - 1]):  # left padding of different widths
        p_ids[i, P - n :] = torch.randint(1, vocab, (n,), generator=g)
        p_mask[i, P - n :] = 1
    p_ids, p_mask = p_ids.repeat_interleave(G, 0), p_mask.repeat_interleave(G, 0)
    c_len = torch.randint(1, C + 1, (3 * G,), generator=g)
    c_mask = (torch.arange(C)[None] < c_len[:, None]).long()
    c_ids = torch.randint(1, vocab, (3 * G, C), generator=g).masked_fill(c_mask == 0, 0)
    return p_ids, p_mask, c_ids, c_mask, torch.arange(3).repeat_interleave(G)
