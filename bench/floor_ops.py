"""What bench/floor.py measures inside its floor worker (the current code only): the exact matmul shapes of
real training steps (forward pre-hooks on every nn.Linear, and the lean decode's direct products), each shape's time
alone (the floor), and the per-op profile of one decode step and one training micro-batch (torch.profiler)."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter

import torch
import torch.nn.functional as F

PHASES = ("generation", "training")
DECODE_ROWS_MAX = 256  # as rlvr.models.packed_linears: products up to this many rows also timed from packed weights
SAMPLER = "floor::sampler"  # the profiler label around the decode's sampling call
# the training forward's log-probs (rlvr.algo.token_logprobs): its autograd node's forward and backward, whose ops
# (exp, sub, sums over the vocabulary) count as log-probs, not as norms/activations
LOGPROB_NODES = ("_TokenLogProbs", "_TokenLogProbsBackward")


# ----------------------------------------------------------------------------- the shapes a step runs


class LinearShapes:
    """Counts of the policy's nn.Linear calls (LoRA's base layers and adapters are nn.Linear too), one Counter per
    step, keyed by (phase, M rows, K in, N out, dtype the product ran in, the products it costs). The phase is what
    `phase` holds when the call happens (floor.py sets it around the engine's generate and the trainer's update)."""

    def __init__(self, model):
        self.phase = "other"
        self.steps: list[Counter] = []
        self.handles = [m.register_forward_pre_hook(self._hook) for m in model.modules() if isinstance(m, torch.nn.Linear)]
        # the lean decode step runs a plain Linear's product straight from its weight (compiled_decode.Product), no module
        # call and so no hook: those products are recorded where they run
        import rlvr.rollout.engines.hf.lean_decode as lean_decode
        from rlvr.rollout.engines.hf.compiled_decode import Product

        self._lean, self._direct_product, self._Product = lean_decode, lean_decode._product, Product
        lean_decode._product = self._recording_product

    def _hook(self, module, args) -> None:
        x = args[0]
        on = x.device.type
        # under autocast the product runs in the autocast dtype (linear is on its lower-precision list)
        dtype = torch.get_autocast_dtype(on) if torch.is_autocast_enabled(on) and x.is_floating_point() else module.weight.dtype
        self._count(x, module.in_features, module.out_features, dtype, module.weight.requires_grad)

    def _recording_product(self, p, x: torch.Tensor, casts: dict | None = None) -> torch.Tensor:
        if isinstance(p, self._Product):  # runs in its weight's dtype (packed or plain)
            self._count(x, x.shape[-1], p.out_features, p.weight.dtype, weight_trained=False)
        return self._direct_product(p, x, casts)

    def _count(self, x: torch.Tensor, K: int, N: int, dtype: torch.dtype, weight_trained: bool) -> None:
        grad = torch.is_grad_enabled()
        # the backward of y = x W^T: grad_input = gy W when x needs a gradient, grad_weight = gy^T x when W is trained
        products = (
            ("forward",) + (("grad_input",) if grad and x.requires_grad else ()) + (("grad_weight",) if grad and weight_trained else ())
        )
        self.steps[-1][(self.phase, x.numel() // K, K, N, str(dtype).removeprefix("torch."), products)] += 1

    def begin_step(self) -> None:
        self.steps.append(Counter())

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self._lean._product = self._direct_product


def product_flops(M: int, K: int, N: int) -> int:
    return 2 * M * K * N


def time_products(keys, working_set: int, threads: int, reps: int = 5, min_seconds: float = 0.02, passes: int = 2) -> dict:
    """Seconds of each product alone, {(M, K, N, dtype, product): s}: the best over `reps` runs of the mean of n
    products, n enough for `min_seconds`. Weights cycle through views of one buffer as large as the model's Linear
    weights (`working_set` elements), so a decode-shaped product finds its weight in cache exactly when the whole
    model fits there, as in the real decode; activations are one tensor per shape. A forward of at most
    DECODE_ROWS_MAX rows is also timed from weights packed once for oneDNN (as rlvr's decode runs it), and the
    faster of the two is the floor. All shapes are timed `passes` times, in turn forward and backward through the
    list, and each keeps its fastest: a shape's few back-to-back runs once all fell into one burst of other work on
    the machine (an Intel run timed 3072 x 320 x 80 at 27.6 ms; alone, and in the step's own profile, it takes
    0.6 ms), which overstated that config's floor by a third."""
    shapes = sorted(set(keys))
    out: dict = {}
    for i in range(passes):
        for key, seconds in _time_once(shapes[:: -1 if i % 2 else 1], working_set, threads, reps, min_seconds).items():
            out[key] = min(seconds, out.get(key, float("inf")))
    return out


def _time_once(shapes: list, working_set: int, threads: int, reps: int, min_seconds: float) -> dict:
    torch.set_num_threads(threads)
    buffers: dict[str, torch.Tensor] = {}
    out = {}
    for M, K, N, dtype, product in shapes:
        dt = getattr(torch, dtype)
        buf = buffers.setdefault(dtype, torch.randn(max(working_set, N * K), dtype=dt))
        copies = buf.numel() // (N * K)
        weights = [buf[i * N * K : (i + 1) * N * K].view(N, K) for i in range(copies)]
        x, gy = torch.randn(M, K, dtype=dt), torch.randn(M, N, dtype=dt)
        ways = [(_product(product, x, gy), weights)]
        if product == "forward" and M <= DECODE_ROWS_MAX:  # also from weights packed once
            packed = [torch.ops.mkldnn._reorder_linear_weight(w, M) for w in weights]
            ways.append((lambda p, x=x: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""), packed))
        out[(M, K, N, dtype, product)] = min(_best_time(fn, ws, reps, min_seconds) for fn, ws in ways)
    return out


def _best_time(fn, weights: list, reps: int, min_seconds: float) -> float:
    t = time.perf_counter()
    fn(weights[0])  # also the first call's one-off set-up (oneDNN kernels for bf16)
    first = time.perf_counter() - t
    n, i, best = max(1, min(2000, int(min_seconds / max(first, 1e-7)))), 1, float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            fn(weights[i % len(weights)])
            i += 1
        best = min(best, (time.perf_counter() - t) / n)
    return best


def _product(product: str, x: torch.Tensor, gy: torch.Tensor):
    """The product as a function of the weight W [N, K]: the forward x W^T (as nn.Linear, no bias in these
    models), or what autograd's mm backward computes for the column-major W^T: gy W, and gy^T x in W's layout."""
    if product == "forward":
        return lambda w: F.linear(x, w)
    if product == "grad_input":
        return lambda w: torch.mm(gy, w)
    return lambda w: torch.mm(gy.t(), x)


def step_floor(steps: list[Counter], seconds: dict) -> dict:
    """floor_of per phase, and the total: the median over steps of the phases' sum."""
    floor = floor_of(steps, seconds)
    floor["total"] = {"seconds": statistics.median(sum(floor[p]["per_step"][i] for p in floor) for i in range(len(steps)))}
    return floor


def counts_to_json(steps: list[Counter]) -> list:
    """LinearShapes.steps as JSON: per step [[phase, M, K, N, dtype, [products]], count] pairs."""
    return [[[[*k[:5], list(k[5])], c] for k, c in s.items()] for s in steps]


def counts_from_json(steps: list) -> list[Counter]:
    return [Counter({(*k[:5], tuple(k[5])): c for k, c in s}) for s in steps]


RATE_SIZE = 1024  # the machine-rate probe's product: [1024, 1024] x [1024, 1024] in fp32, 2.1 GFLOP, compute-bound


def machine_rate(threads: int, seconds: float = 1.0) -> float:
    """GFLOP/s of one fixed fp32 product run back to back for `seconds` on `threads` threads: how fast the machine
    runs at that moment. A shared host moves between speed regimes: on an Intel Xeon VM (2 threads) one product ran
    at 209-218 GFLOP/s, then 266-272, in spells of ~10 s, and every time measured in a spell moves
    with it. floor.py takes the rate just before and after each process it runs, so a multiple that compares a run
    in one regime with a floor timed in another shows as such."""
    torch.set_num_threads(threads)
    n = RATE_SIZE
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm
    calls, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        a @ b
        calls += 1
    return product_flops(n, n, n) * calls / elapsed / 1e9


def rates_text(rates: list[float]) -> str:
    """A worker's [before, after] machine_rate for its log line."""
    return "rate {:.0f}->{:.0f} GFLOP/s".format(*rates)


def floor_of(steps: list[Counter], seconds: dict) -> dict:
    """Per phase: the floor (median over steps of the sum of count x product time), GFLOP, the shapes and their rates."""
    res = {}
    for phase in sorted({k[0] for s in steps for k in s}):
        per_step, flops = [], []
        for s in steps:
            calls = [(k, c) for k, c in s.items() if k[0] == phase]
            per_step.append(sum(c * seconds[(*k[1:5], p)] for k, c in calls for p in k[5]))
            flops.append(sum(c * product_flops(*k[1:4]) * len(k[5]) for k, c in calls))
        shapes = sorted({(*k[1:5], p) for s in steps for k in s if k[0] == phase for p in k[5]})
        res[phase] = {
            "seconds": statistics.median(per_step),
            "per_step": per_step,
            "gflop": statistics.median(flops) / 1e9,
            "shapes": [
                {"M": M, "K": K, "N": N, "dtype": d, "product": p, "seconds": seconds[(M, K, N, d, p)],
                 "gflops": product_flops(M, K, N) / seconds[(M, K, N, d, p)] / 1e9}
                for M, K, N, d, p in shapes
            ],
        }  # fmt: skip
    return res


# ----------------------------------------------------------------------------- the profile

MATMUL = {"mm", "addmm", "addbmm", "matmul", "linear", "_addmm_activation", "mv", "dot"}
PACKED_MATMUL = {"mkldnn::_linear_pointwise"}  # a Linear's product from a pre-packed weight (rlvr.models.packed_linears)
# attention's own ops when it runs as explicit products (rlvr's decode and short training attention): its batched
# products (a Linear on a 3-D input folds into mm, so bmm is only ever attention here) and its softmax (the
# log-probs use log_softmax and logsumexp, the sampler's softmax is inside the sampler label)
ATTENTION = {"bmm", "baddbmm", "softmax", "_softmax", "_softmax_backward_data"}
# elementwise arithmetic and the reductions RMSNorm, SwiGLU and rotary embeddings are made of, and their backwards
ELEMENTWISE = {
    "add", "sub", "rsub", "mul", "div", "neg", "pow", "rsqrt", "sqrt", "mean", "sum", "silu", "silu_backward", "gelu",
    "gelu_backward", "sigmoid", "sigmoid_backward", "tanh", "tanh_backward", "exp", "log", "lerp", "rms_norm",
    "_fused_rms_norm", "_fused_rms_norm_backward", "where", "masked_fill", "clamp", "clamp_min", "maximum", "minimum",
    "abs", "reciprocal", "addcmul", "addcdiv", "threshold_backward", "square", "norm", "var", "amax", "max", "min",
}  # fmt: skip
# the log-probabilities over the vocabulary (the training forward's counterpart of sampling)
LOGPROBS = {
    "log_softmax", "_log_softmax", "logsumexp", "_log_softmax_backward_data", "gather", "nll_loss",
}  # fmt: skip
COPIES = {
    "copy", "cat", "clone", "to", "_to_copy", "contiguous", "expand", "expand_as", "view", "view_as", "_unsafe_view",
    "reshape", "_reshape_alias", "slice", "select", "transpose", "t", "permute", "unsqueeze", "squeeze", "as_strided",
    "embedding", "embedding_backward", "embedding_dense_backward", "repeat", "repeat_interleave", "pad", "constant_pad_nd",
    "stack", "split", "chunk", "narrow", "unbind", "detach", "alias", "lift_fresh", "resolve_conj", "resolve_neg",
    "flatten", "unflatten", "fill", "scatter", "scatter_add", "masked_scatter", "set_", "split_with_sizes", "slice_backward",
    "select_backward", "zero",
}  # fmt: skip
CATEGORIES = ("matmul", "attention", "norms/activations", "sampling/log-probs", "copies", "other ops", "Python/dispatch")


def category(ev, in_sampler: bool) -> str:
    """The category of one profiler event by its name (rule in floor.py's docstring). Only aten ops are ops:
    the self time of everything else (autograd engine nodes, labels) is framework overhead, Python/dispatch."""
    if ev.name in PACKED_MATMUL:
        return "sampling/log-probs" if in_sampler else "matmul"
    if not ev.name.startswith("aten::"):
        return "Python/dispatch"
    if in_sampler:
        return "sampling/log-probs"
    op = ev.name[6:]
    base = op.rstrip("_")
    if op in MATMUL:
        return "matmul"
    if op in ATTENTION or "attention" in op or "scaled_dot_product" in op:
        return "attention"
    if base in LOGPROBS:
        return "sampling/log-probs"
    if base in ELEMENTWISE:
        return "norms/activations"
    if base in COPIES or base.startswith(("index", "empty", "new_", "zeros", "ones", "full", "copy")):
        return "copies"
    return "other ops"


def _packed_flops(ev) -> int:
    """2 x M x K x N of a packed product (the profiler counts none for it): input [..., K], weight [N, K]."""
    shapes = ev.input_shapes
    if not shapes or len(shapes) < 2 or len(shapes[0]) < 1 or len(shapes[1]) != 2:
        return 0
    x, (N, K) = shapes[0], shapes[1]
    rows = 1
    for d in x[:-1]:
        rows *= d
    return 2 * rows * K * N


def _inside(ev, *labels: str) -> bool:
    p = ev.cpu_parent
    while p is not None:
        if p.name in labels:
            return True
        p = p.cpu_parent
    return False


PROFILE_TRIES = 4  # profiled runs at most, until one runs without page faults (profiled's docstring)


def minor_faults() -> int:
    """This process's minor page faults so far (Linux; 0 where getrusage does not count them)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def profiled(fn, n: int) -> dict:
    """Run fn n times plain (timed), then n times under torch.profiler; seconds per call by category, all from the
    profiled run so that they add up to its wall time: Python/dispatch = that wall time less the ops' self times.
    The profiler's own cost per op is in them (the plain wall time, `wall_plain`, shows how much).

    The profiler's own allocations move the heap, so a profiled run can take fresh pages for tensors that the plain
    runs reuse (with keep_cpu_memory the training's steady state faults none): a large micro-batch then faulted
    hundreds of thousands of pages, and the ops that write new tensors, the elementwise ones most, took 2-5x their
    time (config E: norms/activations 0.9 s without faults, 2.5-5.2 s with). So while a profiled run page-faults more
    than the plain run did, fn runs n times plain again (the heap settles with the profiler's memory freed) and is
    profiled again, up to PROFILE_TRIES profiled runs; the one with the fewest faults is reported, with its count
    (`faults`, `faults_plain`: per call)."""
    f0, t = minor_faults(), time.perf_counter()
    for _ in range(n):
        fn()
    plain, faults_plain = (time.perf_counter() - t) / n, minor_faults() - f0
    best: dict | None = None
    for tries in range(1, PROFILE_TRIES + 1):
        if tries > 1:
            for _ in range(n):
                fn()
        res = _profile_once(fn, n)
        if best is None or res["faults"] < best["faults"]:
            best = res
        if best["faults"] <= faults_plain:
            break
    assert best is not None
    return {**best, "wall_plain": plain, "faults": best["faults"] // n, "faults_plain": faults_plain // n, "tries": tries}


def _profile_once(fn, n: int) -> dict:
    """One profiled run of fn n times: seconds per call by category (profiled's docstring), and the run's page faults.
    The profiler's events are dropped before this returns."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        f0, t = minor_faults(), time.perf_counter()
        for _ in range(n):
            fn()
        wall, faults = (time.perf_counter() - t) / n, minor_faults() - f0
    cats, flops, mm_time = Counter(), 0, 0.0
    for ev in prof.events():
        kind = category(ev, _inside(ev, SAMPLER, *LOGPROB_NODES))
        if kind == "Python/dispatch":
            continue
        cats[kind] += ev.self_cpu_time_total / 1e6 / n
        ev_flops = ev.flops or (_packed_flops(ev) if ev.name in PACKED_MATMUL else 0)
        if kind == "matmul" and ev_flops:
            flops, mm_time = flops + ev_flops / n, mm_time + ev.self_cpu_time_total / 1e6 / n
    cats["Python/dispatch"] = max(0.0, wall - sum(cats.values()))
    return {"wall": wall, "categories": dict(cats), "matmul_gflops": flops / mm_time / 1e9 if mm_time else None, "faults": faults}


def profile_decode(trainer, prompts, params, seeds, n: int = 4) -> dict:
    """One decode step (the sampler on the last logits, then the model's step), as HFEngine._decode runs it
    without its bookkeeping, averaged over n steps from the middle of a decode of the real step's prompts."""
    from rlvr.models.precision import autocast_context
    from rlvr.rollout.engines.hf.forward import decode_mode, generation_mode, prefill
    from rlvr.rollout.engines.hf.steps import choose_layout, start_decode

    engine, model = trainer.engine, trainer.model
    G, T = params.n, params.max_new_tokens
    # steps before, timed, and profiled (up to PROFILE_TRIES times, each after n plain): within the T - 1 the buffers hold
    n = max(1, min(n, (T - 1) // (2 * PROFILE_TRIES + 1)))
    before = max(0, min(T // 2 - n, T - 1 - 2 * PROFILE_TRIES * n))
    with torch.no_grad(), autocast_context(trainer.precision.autocast, trainer.device, model), contextlib.ExitStack() as stack:
        # as HFEngine.generate, inside the source's autocast (the layout's KV dtype depends on it)
        layout = choose_layout(
            model, G, static=engine.static_cache, shared_prefix=engine.shared_prefix, lean=engine.lean, compiled=engine.compiled
        )
        stack.enter_context(generation_mode(model, layout.attention))
        pre = prefill(model, engine.tokenizer, prompts, G)
        step = start_decode(model, pre, layout, G, T)
        stack.enter_context(decode_mode())  # the loop's mode (inference_mode), as HFEngine._decode enters it here
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        active = torch.arange(pre.logits.shape[0])
        state = {"logits": pre.logits, "pos": pre.prompt_mask.sum(-1).repeat_interleave(G, 0)}

        def one():
            with torch.profiler.record_function(SAMPLER):
                token, _, _ = engine._sample(state["logits"], params, gens, active, G)
            state["logits"] = step.step(token, state["pos"], active)
            state["pos"] = state["pos"] + 1

        for _ in range(before):  # to mid-decode: attention over a typical length
            one()
        res = profiled(one, n)
    return {**res, "rows": int(active.numel()), "steps": n}


def profile_micro_batch(trainer) -> dict | None:
    """Forward, loss and backward of the last step's first micro-batch (Updater.micro_batch_step), after one
    unprofiled run; gradients are dropped after (no optimizer step). None when the step trained no rows."""
    from _floor_step import first_micro_batch

    mb = first_micro_batch(trainer)
    if mb is None:
        return None
    mb.run()
    res = profiled(mb.run, 1)
    trainer.optimizer.zero_grad(set_to_none=True)
    e = mb.inputs.episodes
    tokens = int(e.prompt_mask[mb.rows].sum() + e.attention_mask[mb.rows].sum())
    return {**res, "rows": mb.rows.stop - mb.rows.start, "tokens": tokens}
