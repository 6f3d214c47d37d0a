"""Timing one training step's work in fp32 and under bf16 autocast, on the run's own model: what
`model.autocast=auto` decides by (rlvr.models.precision.choose_precision).

A step's work is `trained_rows` forward+backward passes of prompt + completion tokens and
`completion_tokens` decode steps of `decoded_rows` rows. Timing that at full size would cost a
step, so each part is timed at fewer rows and at most MAX_TOKENS tokens per row, sized to take
about FWD_BWD_BUDGET_S / DECODE_BUDGET_S in fp32, and scaled up by tokens (forward+backward)
and rows (decode). bf16 is timed at the same sizes, unless one of the model's own matmuls
already runs far slower in bf16 (CPUs without native bf16 emulate it, often 5-500x slower):
then its estimate is the fp32 one times that slowdown, and nothing bigger runs in bf16.

The decode is timed as a plain transformers forward over a DynamicCache (the hf engine's own
decode keeps an fp32 cache under autocast; the matmuls, which decide the choice, are the same).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from rlvr.models.kv_cache import cache_kwarg
from rlvr.models.precision import autocast_context

MAX_TOKENS = 64  # tokens per row timed: the matmuls are as wide as the model's; attention is a small share
FWD_BWD_BUDGET_S = 0.3  # about how long one timed fp32 forward+backward takes
DECODE_BUDGET_S = 0.05  # about how long one timed fp32 decode step takes
BAIL_RATIO = 3.0  # bf16 this many times slower than fp32 (a matmul, or a first forward+backward): not timed further
DECODE_COST = 1 / 3  # a decode step of R rows costs about a forward of R tokens: a third of a forward+backward
PROBE_FLOPS = 2e7  # one probe matmul: ~0.1 ms in fp32, at most ~70 ms on the slowest emulated bf16 seen (0.3 GFLOP/s)


@dataclass(frozen=True)
class StepShapes:
    """What one training step runs on this rank; the timings are scaled up to it."""

    rows_per_backward: int  # rows in one forward+backward (the update's micro-batch)
    trained_rows: int  # rows run forward+backward per step (every micro-batch of every pass)
    prompt_tokens: int  # a typical rendered prompt
    completion_tokens: int  # rollout.max_new_tokens: decode steps per generation
    decoded_rows: int  # rows decoded together; 0 where generation does not run under autocast (vLLM)


@dataclass(frozen=True)
class StepTimes:
    """Per-step time estimates by precision (`none`: fp32, `bf16`: bf16 autocast)."""

    seconds: dict[str, float]
    measured_at: str  # the reduced sizes that were timed
    note: str = ""  # how the bf16 estimate was made when it was not timed in full


@dataclass(frozen=True)
class _Timed:
    seconds: float  # the per-step estimate
    first: float  # the first (warm-up) forward+backward, one row
    rows: int  # rows per timed forward+backward
    decode_rows: int


def measure_step(model, shapes: StepShapes) -> StepTimes:
    """Estimated seconds per training step of `model` (on the CPU) in fp32 and under bf16 autocast.
    The run's random stream, the model's weights, gradients and mode are as before."""
    with torch.random.fork_rng(devices=[]):
        slowdown = bf16_matmul_slowdown(model)
        fp32 = _time_step(model, "none", shapes)
        at = f"{fp32.rows} rows x {_seq(shapes)} tokens" + (f", decode {fp32.decode_rows} rows" if shapes.decoded_rows else "")
        if slowdown > BAIL_RATIO:
            return StepTimes({"none": fp32.seconds, "bf16": fp32.seconds * slowdown}, at,
                             f"bf16 not timed on the model: one of its matmuls ran {slowdown:.1f}x slower than fp32")
        bf16 = _time_step(model, "bf16", shapes, rows=fp32.rows, decode_rows=fp32.decode_rows, bail_after=BAIL_RATIO * fp32.first)
    note = "" if bf16.rows else f"bf16 timed on one forward+backward only: {bf16.first / fp32.first:.1f}x slower than fp32"
    return StepTimes({"none": fp32.seconds, "bf16": bf16.seconds}, at, note)


@torch.no_grad()
def bf16_matmul_slowdown(model) -> float:
    """bf16-autocast time / fp32 time of one of the model's linear layers on a few rows (about
    PROBE_FLOPS), autocast's weight cast included."""
    weight = next(m.weight for m in model.modules() if isinstance(m, torch.nn.Linear))
    out_features, in_features = weight.shape
    rows = int(min(max(PROBE_FLOPS / (2 * in_features * out_features), 1), 512))
    x = torch.randn(rows, in_features, device=weight.device, dtype=weight.dtype)

    def best(kind: str, reps: int) -> float:
        times = []
        for _ in range(reps + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            with autocast_context(kind, weight.device):
                torch.nn.functional.linear(x, weight)
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    return best("bf16", 2) / max(best("none", 5), 1e-9)


def _seq(shapes: StepShapes) -> int:
    return max(min(shapes.prompt_tokens + shapes.completion_tokens, MAX_TOKENS), 2)


def _time_step(model, kind: str, shapes: StepShapes, *, rows: int | None = None, decode_rows: int | None = None,
               bail_after: float | None = None) -> _Timed:
    """The per-step estimate under `kind`. Sizes not given are chosen from the first forward+backward
    (one row); past `bail_after` seconds that first one is all that runs (rows = 0 in the result)."""
    seq, device = _seq(shapes), next(model.parameters()).device
    vocab = model.get_input_embeddings().num_embeddings
    with autocast_context(kind, device):
        first = _fwd_bwd(model, _ids(1, seq, vocab, device))
        per_token = first / seq  # an upper bound: one row does not fill the matmuls
        if bail_after is not None and first > bail_after:
            tokens = shapes.trained_rows * (shapes.prompt_tokens + shapes.completion_tokens) + shapes.decoded_rows * shapes.completion_tokens * DECODE_COST
            return _Timed(per_token * tokens, first, 0, 0)
        rows = rows or _clamp(FWD_BWD_BUDGET_S / first, shapes.rows_per_backward)
        fwd_bwd = min(_fwd_bwd(model, _ids(rows, seq, vocab, device)) for _ in range(2))
        train = fwd_bwd / (rows * seq) * shapes.trained_rows * (shapes.prompt_tokens + shapes.completion_tokens)
        if not shapes.decoded_rows:
            return _Timed(train, first, rows, 0)
        decode_rows = decode_rows or _clamp(DECODE_BUDGET_S / (DECODE_COST * per_token), shapes.decoded_rows)
        step = _decode_step(model, decode_rows, min(shapes.prompt_tokens, MAX_TOKENS), vocab, device)
    return _Timed(train + step * shapes.decoded_rows / decode_rows * shapes.completion_tokens, first, rows, decode_rows)


def _fwd_bwd(model, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    logits = model(input_ids=ids).logits
    logits.float().log_softmax(-1).mean().backward()
    seconds = time.perf_counter() - t0
    for p in model.parameters():
        p.grad = None
    return seconds


@torch.no_grad()
def _decode_step(model, rows: int, prompt_tokens: int, vocab: int, device) -> float:
    """Seconds of one decode step (one new token for each of `rows` rows after a prompt), best of two."""
    was_training = model.training
    model.eval()  # as the engine decodes: no dropout, no checkpointing
    try:
        cache = DynamicCache(config=model.config)
        kwargs = {cache_kwarg(model): cache, "use_cache": True}
        model(input_ids=_ids(rows, prompt_tokens, vocab, device), **kwargs)
        token, times = _ids(rows, 1, vocab, device), []
        for _ in range(3):  # the first is a warm-up
            t0 = time.perf_counter()
            model(input_ids=token, **kwargs)
            times.append(time.perf_counter() - t0)
    finally:
        model.train(was_training)
    return min(times[1:])


def _ids(rows: int, tokens: int, vocab: int, device) -> torch.Tensor:
    """Token ids spread over the vocabulary (what they are does not change the time)."""
    return (torch.arange(rows * tokens, device=device).reshape(rows, tokens) * 7919) % vocab


def _clamp(x: float, most: int) -> int:
    return int(min(max(x, 1), most))
