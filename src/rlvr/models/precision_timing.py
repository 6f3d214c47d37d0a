"""Timing one training step's work in fp32 and under bf16 autocast, on the run's own model: what
`model.autocast=auto` decides by (rlvr.models.precision_choice.choose_precision).

A step's work is `trained_rows` forward+backward passes of prompt + completion tokens and
`completion_tokens` decode steps of `decoded_rows` rows. Timing that at full size would cost a
step, so each part is timed at fewer rows and at most MAX_TOKENS tokens per row, sized to take
about FWD_BWD_BUDGET_S / DECODE_BUDGET_S in fp32, and scaled up by tokens (forward+backward)
and rows (decode). What a pass costs whatever its size (reading every weight, autocast's weight
casts) is scaled up with it, so both estimates come out high, bf16's a little more: bf16 is
chosen where it wins clearly. bf16 is timed at the same sizes, unless one of the model's own matmuls
already runs far slower in bf16 (CPUs without native bf16 emulate it, often 5-500x slower):
then its estimate is the fp32 one times that slowdown, and nothing bigger runs in bf16.

Everything is timed on one thread: with several, on a machine shared with other work, each
parallel op can stall at its thread barrier for a scheduler tick (~10 ms), which swamps these
short timings (seen: the bundled tiny model's fp32 step estimated 7x too slow, and bf16 chosen
where it runs 40x slower); on one thread contention only slows both precisions alike. The fp32 /
bf16 ratio of the matmuls, which decides, is about the same on one thread as on many; the
estimates printed are one thread's.

The decode is timed as a plain transformers forward over a DynamicCache at a short context (the
hf engine's own decode keeps an fp32 cache and attends in fp32 under autocast; the matmuls, which
decide the choice, are the same).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from rlvr.models.kv_cache import cache_kwarg
from rlvr.models.packed_linears import packed_linears_in
from rlvr.models.precision import autocast_context

# Tokens per row timed: fewer leave a forward+backward mostly reading weights (memory-bound), where
# bf16's faster matmuls barely show; attention, which grows with the length, is a small share.
MAX_TOKENS = 64
FWD_BWD_BUDGET_S = 0.5  # about how long one timed fp32 forward+backward takes (at least one row)
DECODE_BUDGET_S = 0.1  # about how long one timed fp32 decode step takes
MIN_DECODE_ROWS = 16  # fewer rows cost a decode step about as much (it reads every weight once), so are scaled up badly
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
    with _one_thread(), torch.random.fork_rng(devices=[]):
        slowdown = bf16_matmul_slowdown(model)
        fp32 = _time_step(model, "none", shapes)
        at = f"1 thread, {fp32.rows} rows x {_row_tokens(shapes)} tokens" + (
            f", decode {fp32.decode_rows} rows" if shapes.decoded_rows else ""
        )
        if slowdown > BAIL_RATIO:
            return StepTimes(
                {"none": fp32.seconds, "bf16": fp32.seconds * slowdown},
                at,
                f"bf16 not timed on the model: one of its matmuls ran {slowdown:.1f}x slower than fp32",
            )
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

    times: dict[str, list[float]] = {"none": [], "bf16": []}
    for _ in range(4):  # alternating, so that both see the same machine; the first of each is a warm-up
        for kind, seen in times.items():
            t0 = time.perf_counter()
            with autocast_context(kind, weight.device):
                torch.nn.functional.linear(x, weight)
            seen.append(time.perf_counter() - t0)
    return min(times["bf16"][1:]) / max(min(times["none"][1:]), 1e-9)


@contextlib.contextmanager
def _one_thread():
    """torch on one thread inside the block (see the module's docstring), as many as before after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _row_tokens(shapes: StepShapes) -> int:
    """Tokens per row of a timed forward+backward."""
    return max(min(shapes.prompt_tokens + shapes.completion_tokens, MAX_TOKENS), 2)


def _time_step(
    model, kind: str, shapes: StepShapes, *, rows: int | None = None, decode_rows: int | None = None, bail_after: float | None = None
) -> _Timed:
    """The per-step estimate under `kind`. Sizes not given are chosen from the first forward+backward
    (one row, also the warm-up); past `bail_after` seconds that first one is all that runs (rows 0)."""
    device, vocab = next(model.parameters()).device, model.get_input_embeddings().num_embeddings
    seq = _row_tokens(shapes)
    trained_tokens = shapes.trained_rows * (shapes.prompt_tokens + shapes.completion_tokens)
    with autocast_context(kind, device):
        first = _fwd_bwd(model, _ids(1, seq, vocab, device))
        per_token = first / seq  # an upper bound: one row does not fill the matmuls
        if bail_after is not None and first > bail_after:
            return _Timed(per_token * (trained_tokens + DECODE_COST * shapes.decoded_rows * shapes.completion_tokens), first, 0, 0)
        rows = rows or _clamp(FWD_BWD_BUDGET_S / first, shapes.rows_per_backward)
        if rows == 1:  # a big model: one more pass of the warm-up's size
            fwd_bwd = min(first, _fwd_bwd(model, _ids(1, seq, vocab, device)))
        else:
            fwd_bwd = min(_fwd_bwd(model, _ids(rows, seq, vocab, device)) for _ in range(2))
        train = fwd_bwd / (rows * seq) * trained_tokens
        if not shapes.decoded_rows:
            return _Timed(train, first, rows, 0)
        budget_rows = DECODE_BUDGET_S / (DECODE_COST * fwd_bwd / (rows * seq))
        decode_rows = decode_rows or _clamp(max(budget_rows, MIN_DECODE_ROWS), shapes.decoded_rows)
        step = _decode_step(model, decode_rows, vocab, device)
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
def _decode_step(model, rows: int, vocab: int, device) -> float:
    """Seconds of one decode step (one new token for each of `rows` rows), best of two after a warm-up.
    Its context is the few tokens before it, not a prompt: the attention over the prompt costs the
    same in both precisions (the hf engine runs it in fp32 under autocast too), and its prefill would
    cost more than the steps."""
    was_training = model.training
    model.eval()  # as the engine decodes: no dropout, no checkpointing
    try:
        kwargs = {cache_kwarg(model): DynamicCache(config=model.config), "use_cache": True}
        token, times = _ids(rows, 1, vocab, device), []
        with packed_linears_in(model):  # as the engine's decode: its products from packed weights (packed at the warm-up)
            for _ in range(3):
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
