"""The training forward under torch.compile, compiled a handful of times per run.

torch.compile specialises a graph to the shapes it is called with, and building the forward and
backward graphs of even a small Llama takes long on CPU: a new graph at every completion
length costs more than it saves (bench/results/compile.md). So:

- lengths go in buckets (`bucket_length`): the prompt is padded on the left and the completion on
  the right up to its bucket, with attention mask 0. Padded prompt columns are keys no token
  attends to; padded completion columns come after every real token (causal attention: no real
  token sees them) and their log-probs are cut off before the loss. Log-probs and gradients are
  the plain path's (rlvr.models.forward) up to the rounding of the compiled kernels.
- the row count is a dynamic dimension: one graph serves every micro-batch size. torch
  specialises a dimension of size 1, so a micro-batch of one row runs as two copies of it (the
  copy's log-probs are dropped: it gets no gradient).

A run then compiles once per (prompt bucket, completion bucket) it meets, e.g. at most 4 graphs
for 8-token prompts and max_new_tokens <= 64 (the backward of each at its first backward). Only
the training forward (with gradient) is compiled; the no-gradient forwards (old log-probs with
dropout, the reference) and the shared-prefix path stay eager.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch

from rlvr.config import ConfigError
from rlvr.models.forward import TokenLogProbs, logits_plain, logprobs_from_logits

# Device types where the compiled forward is measured to win within a run's first steps (optim.compile=auto):
# none yet (bench/results/compile.md: on CPU no faster than eager in fp32, slower in bf16; unmeasured on CUDA).
COMPILE_WINS_ON: frozenset[str] = frozenset()
BUCKET_STEP = 16  # the finest bucket step (lengths up to 128)
RECOMPILE_LIMIT = 64  # graphs of the compiled forward before torch.compile falls back to eager (its default: 8)


def bucket_length(n: int) -> int:
    """The padded length of n tokens: the next multiple of 16 up to 128, then of an eighth of the next
    power of two (160, 192, 224, 256, 320, ...): at most 15 tokens or 25% of padding, four buckets per
    doubling. 0 stays 0."""
    if n <= 0:
        return 0
    step = max(BUCKET_STEP, 2 ** (math.ceil(math.log2(n)) - 3))
    return math.ceil(n / step) * step


def pad_to_buckets(
    prompt_ids: torch.Tensor,  # [N, P] left-padded
    prompt_mask: torch.Tensor,  # [N, P]
    completion_ids: torch.Tensor,  # [N, C] right-padded
    completion_mask: torch.Tensor,  # [N, C]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(ids [N', P' + C'], attention mask [N', P' + C'], C'): the prompt left-padded to P' =
    bucket_length(P) and the completion right-padded to C' = bucket_length(C), padding with mask 0;
    N' = N, or 2 for one row (the row twice). The real rows are the first N, their completion
    positions the first C after column P'."""
    P, C = prompt_ids.shape[1], completion_ids.shape[1]
    left, right = bucket_length(P) - P, bucket_length(C) - C
    ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [N, P + C]
    attn = torch.cat([prompt_mask, completion_mask], dim=1)
    ids = torch.nn.functional.pad(ids, (left, right), value=0)  # [N, P' + C'] any token id: masked
    attn = torch.nn.functional.pad(attn, (left, right), value=0)
    if ids.shape[0] == 1:
        ids, attn = ids.expand(2, -1), attn.expand(2, -1)
    return ids.contiguous(), attn.contiguous(), C + right


def _bucketed_logprobs(model, ids, attn, C: int, temperature: float, with_entropy: bool, entropy_grad: bool):
    """The function torch.compile compiles: the plain path on padded inputs ([N', P' + C'] -> [N', C'])."""
    logits = logits_plain(model, ids, attn, C)  # [N', C' + 1, V]
    out = logprobs_from_logits(
        logits, ids[:, -C:], temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad, compiled=True
    )  # symbolic row count: one chunk, the kernels fuse it
    return out.logp, out.entropy


class CompiledForward:
    """completion_logprobs's plain path under torch.compile, at bucketed lengths (module docstring)."""

    def __init__(self, device: torch.device, backend: str = "inductor"):
        """`backend`: torch.compile's; `eager` traces and guards the same graphs but runs the plain kernels (tests)."""
        if device.type == "cpu" and backend == "inductor":
            require_cpp_compiler()
        self.fn = torch.compile(_bucketed_logprobs, dynamic=False, backend=backend)

    def __call__(
        self,
        model,
        prompt_ids: torch.Tensor,  # [N, P] left-padded
        prompt_mask: torch.Tensor,  # [N, P]
        completion_ids: torch.Tensor,  # [N, C] right-padded
        completion_mask: torch.Tensor,  # [N, C]
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = False,
    ) -> TokenLogProbs:
        N, C = completion_ids.shape
        ids, attn, C_padded = pad_to_buckets(prompt_ids, prompt_mask, completion_ids, completion_mask)
        torch._dynamo.maybe_mark_dynamic(ids, 0)
        torch._dynamo.maybe_mark_dynamic(attn, 0)
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            logp, entropy = self.fn(model, ids, attn, C_padded, temperature, with_entropy, entropy_grad)
        return TokenLogProbs(logp[:N, :C], None if entropy is None else entropy[:N, :C])


class CompileClock:
    """The graphs torch.compile builds and the seconds it spends building them (a forward graph at
    its first call, its backward at the first backward through it), counted while `measuring()`."""

    def __init__(self):
        self.graphs = 0
        self.seconds = 0.0

    @contextlib.contextmanager
    def measuring(self):
        from torch._dynamo.utils import counters

        handler = torch._dynamo.callback_handler  # nested compiles report once: the outermost
        started: list[float] = []

        def start(_args) -> None:
            started.append(time.perf_counter())

        def end(_args) -> None:
            self.seconds += time.perf_counter() - started.pop()

        graphs = counters["stats"]["unique_graphs"]
        handler.register_start_callback(start)
        handler.register_end_callback(end)
        try:
            yield self
        finally:
            handler.remove_start_callback(start)
            handler.remove_end_callback(end)
            self.graphs += counters["stats"]["unique_graphs"] - graphs


def require_cpp_compiler(field: str = "optim.compile") -> None:
    """torch.compile on CPU writes C++ kernels: without a compiler it would fail at the first step."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except Exception as e:  # inductor's InvalidCxxCompiler, or the search failing
        raise ConfigError(
            f"`{field}`=on needs a C++ compiler on CPU (torch.compile's inductor writes C++ kernels) and none "
            f"was found ({type(e).__name__}: $CXX or g++): install g++, or set {field}=off"
        ) from e
