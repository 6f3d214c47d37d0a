"""The training forward: per-token log-probs of completions under a causal LM.

Two ways to compute the same numbers:
- the plain path runs every row's prompt + completion through the model;
- the shared-prefix path (rows of a group share one prompt) runs each distinct prompt once,
  keeps its KV cache *with autograd* and runs only the completions on top: their attention meets
  the group's prompt keys once per group (rlvr.models.prefix_attention) where the model runs
  rlvr's training attention, else over the prompt's keys and values repeated for the group's rows.
  Gradients reach the prompt positions either way (summed over the group), so loss and gradients
  equal the plain path's.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from rlvr.algo import selective_log_softmax, token_entropy, token_entropy_with_grad, token_logprobs
from rlvr.models.attention import NAME as ATTENTION_NAME
from rlvr.models.attention import short_attention_explicit
from rlvr.models import native_logprobs
from rlvr.models.lora_training import lora_training_forward
from rlvr.models.native_swiglu import swiglu_mlps
from rlvr.models.shared_cast import shared_attention_inputs
from rlvr.models.norm_rotary import fused_norm_and_rotary
from rlvr.models.prefix_attention import SharedPrefix, shared_prefix
from rlvr.models.kv_cache import cache_kwarg, dynamic_layer, prefilled_kv


class TokenLogProbs(NamedTuple):
    logp: torch.Tensor  # [N, C] log p(completion token | prefix) at the sampling temperature
    entropy: torch.Tensor | None  # [N, C] entropy of each position's distribution (no grad unless entropy_grad)


_DROPOUT_MODULES = (
    torch.nn.Dropout,
    torch.nn.Dropout1d,
    torch.nn.Dropout2d,
    torch.nn.Dropout3d,
    torch.nn.AlphaDropout,
    torch.nn.FeatureAlphaDropout,
)


def uses_dropout(model) -> bool:
    """Whether a forward in training mode differs from one in eval mode: a dropout module with p > 0
    (e.g. LoRA's), or a dropout probability > 0 in a transformers config (attention dropout is
    applied inside the attention function, by no module)."""
    if any(isinstance(m, _DROPOUT_MODULES) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    settings = config.to_dict() if config is not None and hasattr(config, "to_dict") else {}
    return any(k.endswith(("dropout", "pdrop")) and type(v) in (int, float) and v > 0 for k, v in settings.items())


def disable_dropout(model) -> None:
    """Dropout off for good (model.disable_dropout, TRL's disable_dropout): every dropout module's p, every module's
    float `attention_dropout` (transformers' attention reads it, not a module) and every `*dropout` / `*pdrop` number
    of the config (sub-configs too) set to 0, so that `uses_dropout` is False."""
    for m in model.modules():
        if isinstance(m, _DROPOUT_MODULES):
            m.p = 0.0
        if type(getattr(m, "attention_dropout", None)) is float:
            m.attention_dropout = 0.0
    configs = [getattr(model, "config", None)]
    while configs:
        config = configs.pop()
        for key, value in vars(config).items() if config is not None and hasattr(config, "to_dict") else ():
            if key.endswith(("dropout", "pdrop")) and type(value) in (int, float) and value > 0:
                setattr(config, key, 0.0)
            elif hasattr(value, "to_dict"):
                configs.append(value)


@contextlib.contextmanager
def eval_mode(model):
    """The model in eval mode (no dropout) inside the block, in the mode it had after it."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def trim_padding(prompt_ids, prompt_mask, completion_ids, completion_mask):
    """Drop prompt columns that are padding in every row (left) and completion columns past the
    longest completion (right): the forward then costs what the batch really holds."""
    P = prompt_mask.shape[1]
    first = int((prompt_mask.sum(0) > 0).nonzero()[0]) if prompt_mask.any() else P
    C = int(completion_mask.sum(-1).max().item()) if completion_mask.numel() else 0
    C = max(C, 1)
    return prompt_ids[:, first:], prompt_mask[:, first:], completion_ids[:, :C], completion_mask[:, :C]


def group_runs(group_ids: torch.Tensor, prompt_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs of consecutive rows of the same group (and, given prompt_ids [N, P], the same prompt: a source may
    give a group's episodes different prompts, e.g. an outside agent's own): (index of each run's first row [U],
    run lengths [U])."""
    same = group_ids[1:] == group_ids[:-1]  # [N-1] row i+1 is in row i's group
    if prompt_ids is not None:
        same &= (prompt_ids[1:] == prompt_ids[:-1]).all(-1)
    starts = torch.cat([torch.ones(1, dtype=torch.bool, device=group_ids.device), ~same]).nonzero().squeeze(-1)
    ends = torch.cat([starts[1:], torch.tensor([group_ids.shape[0]], device=group_ids.device)])
    return starts, ends - starts


def logits_plain(model, ids: torch.Tensor, attn: torch.Tensor, C: int) -> torch.Tensor:
    """Logits [N, C + 1, V] of the last C + 1 tokens of ids [N, L] (prompt + completion; attention mask attn):
    position t predicts completion token t, the last position what would follow the completion (logprobs_from_logits
    reads the first C: slicing here would copy the logits). Logits only for those positions (logits_to_keep)."""
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=C + 1, use_cache=False).logits


def _repeat_rows(x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """repeat_interleave over dim 0; equal counts go through expand (its backward is a plain sum
    over the copies, several times faster on CPU than repeat_interleave's scatter-add)."""
    if bool((counts == counts[0]).all()):
        g = int(counts[0])
        return x.unsqueeze(1).expand(x.shape[0], g, *x.shape[1:]).reshape(x.shape[0] * g, *x.shape[1:])
    return x.repeat_interleave(counts, dim=0)


def _logits_shared_prefix(model, prompt_ids, prompt_mask, completion_ids, completion_mask, starts, counts) -> list[torch.Tensor]:
    """The logits of completion token 0 (the prompt's last position, [N, 1, V]) and of tokens 1.. (the completion's
    positions, [N, C, V], the last predicting past the completion), apart: joined they would be a copy of the logits."""
    from transformers import DynamicCache

    ckw = cache_kwarg(model)
    u_ids, u_mask = prompt_ids[starts], prompt_mask[starts]  # [U, P]
    cache = DynamicCache(config=model.config)
    head = model(
        input_ids=u_ids,
        attention_mask=u_mask,
        position_ids=(u_mask.cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
        logits_to_keep=1,
        **{ckw: cache},
    ).logits  # [U, 1, V]
    attn = torch.cat([prompt_mask, completion_mask], dim=1)  # [N, P + C]
    pos = (attn.cumsum(-1) - 1).clamp(min=0)[:, prompt_ids.shape[1] :]
    tail = _completions_over_grouped_prefix(model, cache, u_mask, completion_ids, completion_mask, pos, counts)
    if tail is None:
        tail = _completions_over_repeated_prefix(model, cache, completion_ids, attn, pos, counts)
    return [_repeat_rows(head, counts), tail]


def _completions_over_grouped_prefix(model, cache, u_mask, completion_ids, completion_mask, pos, counts) -> torch.Tensor | None:
    """Logits [N, C, V] of the completions over their group's prompt once (rlvr.models.prefix_attention), where the
    model runs rlvr's training attention on full-attention layers only and every group has as many rows; else None."""
    from transformers.cache_utils import DynamicLayer

    config = getattr(model, "config", None)
    layers = cache.layers
    if (
        getattr(config, "_attn_implementation", None) != ATTENTION_NAME
        or not bool((counts == counts[0]).all())
        or not all(type(layer) is DynamicLayer for layer in layers)  # no sliding windows, no linear attention
    ):
        return None
    kv = [prefilled_kv(layer) for layer in layers]
    prefix = SharedPrefix([k for k, _ in kv], [v for _, v in kv], u_mask.bool(), int(counts[0]))
    with shared_prefix(prefix) as taken:
        C = completion_ids.shape[1]
        logits = model(input_ids=completion_ids, attention_mask=completion_mask, position_ids=pos, use_cache=False, logits_to_keep=C).logits
    return logits if taken == set(range(len(layers))) else None  # a layer that attended without its prompt: unusable


def _completions_over_repeated_prefix(model, cache, completion_ids, attn, pos, counts) -> torch.Tensor:
    """Logits [N, C, V] of the completions over the prompt's keys and values repeated for each row of its group
    (differentiable: the repeat sums the rows' gradients back)."""
    for layer in map(dynamic_layer, cache.layers):  # [U, H, P, D] -> [N, H, P, D]
        keys, values = prefilled_kv(layer)
        layer.keys, layer.values = _repeat_rows(keys, counts), _repeat_rows(values, counts)
    C = completion_ids.shape[1]
    return model(
        input_ids=completion_ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=C, **{cache_kwarg(model): cache}
    ).logits


def completion_logprobs(
    model,
    prompt_ids: torch.Tensor,  # [N, P] left-padded
    prompt_mask: torch.Tensor,  # [N, P]
    completion_ids: torch.Tensor,  # [N, C] right-padded
    completion_mask: torch.Tensor,  # [N, C] attention mask of the tokens after the prompt
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,  # the entropy with its gradient (an entropy bonus in the loss)
    group_ids: torch.Tensor | None = None,  # [N]: share each group's prompt forward (None: plain path)
) -> TokenLogProbs:
    """Log-probs of each token after the prompt, from logits divided by the sampling temperature
    (so that they are the probabilities the sampler used and the ratio starts at exactly 1).
    Logits are computed only for those positions (logits_to_keep). `group_ids`: consecutive rows
    of the same group share one prompt, which then runs once; a no-op when no group repeats."""
    starts = counts = None
    if group_ids is not None and prompt_ids.shape[0] > 1 and prompt_ids.shape[1] > 0:
        starts, counts = group_runs(group_ids.to(prompt_ids.device), torch.where(prompt_mask.bool(), prompt_ids, -1))
        if len(starts) == prompt_ids.shape[0]:
            starts = None  # nothing shared
    # the same math as SDPA, faster for short rows on the CPU; RMSNorm and rotary as one autograd node each; LoRA's
    # scaling on the adapter's rank-r side; the MLPs' bf16 SwiGLU as one C pass each way; q/k/v's input cast once
    with (
        short_attention_explicit(model),
        fused_norm_and_rotary(model),
        lora_training_forward(model),
        swiglu_mlps(model),
        shared_attention_inputs(model),
    ):
        if starts is None:
            ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [N, P + C]
            parts = [logits_plain(model, ids, torch.cat([prompt_mask, completion_mask], dim=1), completion_ids.shape[1])]
        else:
            parts = _logits_shared_prefix(model, prompt_ids, prompt_mask, completion_ids, completion_mask, starts, counts)

    def of(logits: torch.Tensor, ids: torch.Tensor) -> TokenLogProbs:
        return logprobs_from_logits(logits, ids, temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad)

    if len(parts) == 1:
        return of(parts[0], completion_ids)
    head, tail = of(parts[0], completion_ids[:, :1]), of(parts[1], completion_ids[:, 1:])
    entropy = None if head.entropy is None or tail.entropy is None else torch.cat([head.entropy, tail.entropy], 1)
    return TokenLogProbs(torch.cat([head.logp, tail.logp], 1), entropy)


def logprobs_from_logits(
    logits: torch.Tensor,
    completion_ids: torch.Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    compiled: bool = False,
) -> TokenLogProbs:
    """Log-probs (and entropies) of completion_ids [N, C] from logits [N, >= C, V] (positions past C unused) at the
    sampling temperature: eager, as one autograd node whose backward writes the logits' gradient over them (they must
    be a forward's own output that nothing else reads): on the CPU the C pass of rlvr.models.native_logprobs where it
    built with AVX2 or AVX-512 (3-5x torch's ops forward and backward), else the hand-fused torch ops of
    algo.token_logprobs; `compiled` (inside torch.compile, the row count symbolic), as the plain ops in one chunk, which
    inductor fuses into kernels of its own."""
    if not compiled:
        fused = native_logprobs.token_logprobs if native_logprobs.applies(logits) else token_logprobs
        out = fused(
            logits, completion_ids, temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad, grad_in_logits=True
        )
        return TokenLogProbs(*out)
    logits = logits[:, : completion_ids.shape[1]]
    if temperature != 1.0:  # in fp32 (bf16 logits too), as the eager node and the sampler divide
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    logp = selective_log_softmax(logits, completion_ids, None)
    entropy = (token_entropy_with_grad if entropy_grad else token_entropy)(logits, None) if with_entropy else None
    return TokenLogProbs(logp, entropy)
