"""Per-token log-probs of completions under a causal LM (the training-side forward)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from rlvr.algo import selective_log_softmax, token_entropy


class TokenLogProbs(NamedTuple):
    logp: torch.Tensor  # [N, C] log p(completion token | prefix) at the sampling temperature
    entropy: torch.Tensor | None  # [N, C] entropy of each position's distribution (no grad)


def trim_padding(prompt_ids, prompt_mask, completion_ids, completion_mask):
    """Drop prompt columns that are padding in every row (left) and completion columns past the
    longest completion (right): the forward then costs what the batch really holds."""
    P = prompt_mask.shape[1]
    first = int((prompt_mask.sum(0) > 0).nonzero()[0]) if prompt_mask.any() else P
    C = int(completion_mask.sum(-1).max().item()) if completion_mask.numel() else 0
    C = max(C, 1)
    return prompt_ids[:, first:], prompt_mask[:, first:], completion_ids[:, :C], completion_mask[:, :C]


def completion_logprobs(
    model,
    prompt_ids: torch.Tensor,  # [N, P] left-padded
    prompt_mask: torch.Tensor,  # [N, P]
    completion_ids: torch.Tensor,  # [N, C] right-padded
    completion_mask: torch.Tensor,  # [N, C]
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> TokenLogProbs:
    """Log-probs of each completion token, from logits divided by the sampling temperature
    (so that they are the probabilities the sampler used and the ratio starts at exactly 1).
    Logits are computed only for completion positions (logits_to_keep)."""
    C = completion_ids.shape[1]
    ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [N, P + C]
    attn = torch.cat([prompt_mask, completion_mask], dim=1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=C + 1, use_cache=False).logits
    logits = logits[:, :-1]  # [N, C, V]: position t predicts completion token t
    if temperature != 1.0:
        logits = logits / temperature
    logp = selective_log_softmax(logits, completion_ids)
    entropy = token_entropy(logits) if with_entropy else None
    return TokenLogProbs(logp, entropy)
