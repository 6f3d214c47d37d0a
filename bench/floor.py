"""rlvr's generation, training and step time as multiples of a floor measured at the exact shapes the step runs.

    python bench/floor.py                                    # configs A-F, writes bench/results/floor.md (and .json)
    python bench/floor.py --configs B,E --before main        # two versions of the code side by side, in one run
    python bench/floor.py --configs A --warmup 0 --steps 1 --rounds 1 --threads 1 --out /tmp/floor.md   # smoke test
    python bench/floor.py --configs K --shape 'K={"llama": {"hidden_size": 384, "intermediate_size": 1024,
        "num_hidden_layers": 6, "num_attention_heads": 6, "num_key_value_heads": 2}, "prompts": 4, "group_size": 16,
        "max_new_tokens": 32, "long_prompt": true, "extra": ["model.autocast=none"]}'   # a shape of your own

The floor counts only the policy's own matmuls, at the shapes and in the dtype they run, each timed alone:
  * shapes: a floor worker (the current code) runs the config's rlvr steps with a forward pre-hook on every
    nn.Linear of the policy (lm_head included; under peft the base layers and the adapters). Each call is
    counted by phase (generation: inside the engine's generate, prefill and decode; training: inside the
    trainer's update), rows M = input.numel() / in features, in K, out N, the dtype the product ran in (the
    autocast dtype under autocast), and the products it costs: the forward x W^T, plus in a forward with grad
    enabled grad_input = gy W when the input needs a gradient and grad_weight = gy^T x when W is trained (a
    frozen LoRA base: grad_input only). EOS is ignored (rollout.ignore_eos), so every row decodes
    max_new_tokens and the shapes are fixed; the floor is the median over the measured steps.
  * times: every distinct (M, K, N, dtype, product) alone on --threads threads, best of 5 runs of enough calls
    for 20 ms. Weights cycle through views of one buffer as large as all the model's Linear weights (in that
    dtype), so a decode-shaped product reads its weight from memory exactly when the model does not fit in the
    cache, as in the real decode; the activations are one tensor per shape. Each call's dispatch (a few us) is in.
    Forwards of up to 256 rows (decode shapes) are timed both as F.linear and from weights packed once for oneDNN
    (rlvr.models.packed_linears; bf16 1.1-1.5x, fp32 up to 3.4x faster here): the floor is the faster.
  * timed twice: in the floor worker, and again in a process of its own after the config's rlvr runs; each product
    keeps its faster time. The machine's speed moves (on a shared Intel Xeon VM one fp32 product ran at 209-218
    GFLOP/s for spells of ~10 s, then at 266-272), and a floor timed within one slow spell had put a run in a faster
    one at 0.8x its floor (a 77M MQA shape's training). Just before and after every process the driver times one
    1024^3 fp32 product for 1 s (floor_ops.machine_rate) and the report lists those rates: a multiple between a run
    and a floor timed at different rates moves by their ratio, which no number here corrects for.
  * floor = sum over shapes of count x time: per phase, and the total (generation + training) for the step.
    The classic FLOP floor is beside it: 2 x P x generated tokens + 6 x P x (completion + each prompt once)
    over the 2048^3 peak in the run's matmul dtype, P = the Linear layers' weights (a tied output projection counts).

rlvr's times: `time/generate`, `time/train` and `time/step` of its metrics (bench/compare_trl.py's rlvr worker,
the same config overrides, `--warmup` steps left out), medians over `--steps` steps x `--rounds` rounds, each
version in its own process with exactly `--threads` threads, alternating which version goes first per round.
`--before REF` checks REF out in a temporary git worktree and runs its src as "before"; "after" is this tree.
`--after-extra k=v,...` adds rlvr overrides to "after" only (with `--before HEAD`: one setting against another, same code).
The floor runs once per config (it does not depend on the version).

Profile (current code, `--no-profile` skips it), torch.profiler on the CPU with shapes and FLOPs: one decode step
(the sampler then the model's step, mean of 4 steps from the middle of a decode of the real step's prompts) and
one training micro-batch (Updater.micro_batch_step: forward, loss, backward). Ops' self times by name: matmul
(mm, addmm, linear, matmul...: the Linear layers' products; GFLOP/s from the profiler's FLOPs), attention
(scaled_dot_product*, flash attention, and explicit attention's bmm and softmax with their backwards; its scaling and
masking count as elementwise), norms/activations (elementwise arithmetic and the reductions RMSNorm, SwiGLU and rotary are made of,
with their backwards), sampling/log-probs (in the decode: every op inside the sampler call; in training: the
log_softmax, logsumexp and gather over the vocabulary, or every op of algo.token_logprobs' node), copies (copy_,
cat, index*, clone, to, views, expand, empty/zeros allocations, embedding lookups), other ops; Python/dispatch = the
region's wall time less the ops' self times (autograd engine nodes and labels count here). All from the profiled
run, so they add up to its wall time and the profiler's own per-op cost is in them; the wall time without the
profiler is beside. A profiled run that page-faults more than the plain run is run plain and profiled again (up
to 4 tries, the fewest faults kept; floor_ops.profiled): fresh pages slowed the elementwise ops 2-5x. Lists: bench/floor_ops.py.

Configs (EOS ignored; rlvr's settings as bench/compare_trl.py's):
  A-D  compare_trl.CONFIGS. D is TRL's defaults for TRL; for rlvr it is B plus optim.micro_batch_size=16
       (compare_trl.RLVR_BEST), so it is not B's rlvr run.
  E    larger GQA Llama (hidden 768, 12 layers, 12 heads, 4 kv heads, intermediate 2048, ~76M), short prompts, 8 x 8, 64 new tokens
  F    smaller GQA Llama (hidden 320, 8 layers, 8 heads, 2 kv heads, intermediate 864, ~8.8M), C's ~256-token
       prompts, 4 prompts x 16, 48 new tokens
  G    E with LoRA (r 16 on every Linear, through peft): the base weights are frozen, so their backward products
       compute only the input's gradient (the floor counts them so), and the adapters add their own small products
  I    G in fp32 (model.autocast=none), as on a CPU whose bf16 is emulated: its decode runs each adapted layer as
       one product with the adapter merged in (rlvr.models.lora_merge; bf16 keeps peft's three)
  J    B in fp32 (model.autocast=none), as a CPU whose bf16 is emulated runs it
  V    B's batch on a small GQA Llama with a 32000-token vocabulary (hidden 256, 4 layers, 4 heads, 2 kv heads,
       intermediate 768; 8.2M of its 11.3M Linear parameters are the lm_head), as real tokenizers have: the
       vocabulary-wide log-softmax, entropy and sampling weigh as they do on real models
  --shape NAME=JSON adds a config of your own (then name it in --configs): "model" a local model folder (its
       tokenizer renders the chat prompts) or "llama" the dims of a random-weight Llama on the character tokenizer
       (built once under /tmp/rlvr_bench/shape_NAME; "model_type": "qwen3", "qwen2" or "mistral" among them builds that
       architecture: bench/_models.py); "prompts", "group_size", "max_new_tokens", "long_prompt" (true: C's
       ~256-token prompts, "mid": ~75 tokens, false: ~12) and "extra" (rlvr overrides) as above, defaulting to B's.
  H    multi-turn: the bundled tiny-tools model playing guess_number (examples/guess-number.yaml; it calls `guess`
       about 4.5 times an episode), 8 x 8, up to 240 tokens an episode, EOS and turns as they come (not fixed)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import compare_trl  # noqa: E402
import floor_ops  # noqa: E402
from _report import cpu_name, table_row  # noqa: E402

NEW = dict(reward="digit_share", trl_defaults=False)
LORA = ["model.lora.r=16", "model.lora.alpha=32"]  # G: adapters on every Linear (peft), the base frozen
LORA_FP32 = [*LORA, "model.autocast=none"]  # I: G in fp32
# H: examples/guess-number.yaml's multi-turn episodes (bench/multiturn_overlap.py's batch), in place of the prompts
GUESS = [
    "data.path=null", "data.task=guess_number", "rewards=[]", "tools.environment=guess_number", "tools.format=tags",
    "tools.describe=false", "tools.max_turns=6", "tools.timeout_s=5",
]  # fmt: skip
CONFIGS = {
    **{k: compare_trl.CONFIGS[k] for k in "ABCD"},
    "E": compare_trl.CONFIGS["E"],
    "F": compare_trl.CONFIGS["F"],
    "G": {**compare_trl.CONFIGS["E"], "extra": LORA},
    "I": {**compare_trl.CONFIGS["E"], "extra": LORA_FP32},
    "J": {**compare_trl.CONFIGS["B"], "extra": ["model.autocast=none"]},  # B in fp32, as on a CPU without fast bf16
    "V": compare_trl.CONFIGS["V"],  # B's batch on a 32000-token vocabulary
    # a small model's long generation (256 new tokens): the decode reads a KV cache that outgrows the prompt 30 times
    "L": dict(model="llama3m_gqa", max_new_tokens=256, long_prompt=False, **NEW),
    "H": dict(model="tiny-tools", max_new_tokens=240, long_prompt=False, prompts=8, group_size=8, fixed=False, extra=GUESS, **NEW),
}
TIMES = ("generate", "train", "step")
FLOOR_OF = {"generate": "generation", "train": "training", "step": "total"}  # each time against its floor


SHAPE_KEYS = {"model", "llama", "prompts", "group_size", "max_new_tokens", "long_prompt", "extra"}


def add_shape(arg: str) -> str:
    """CONFIGS[NAME] from `--shape NAME=JSON` (the module docstring); returns NAME. Errors name the key."""
    name, sep, text = arg.partition("=")
    if not sep or not name or name in CONFIGS:
        raise SystemExit(f"--shape {arg!r}: expected NAME=JSON with a NAME not among {sorted(CONFIGS)}")
    try:
        shape = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"--shape {name}: not JSON ({e})") from e
    if not isinstance(shape, dict):
        raise SystemExit(f"--shape {name}: a JSON object, not {type(shape).__name__}")
    if unknown := sorted(set(shape) - SHAPE_KEYS):
        raise SystemExit(f"--shape {name}: unknown key(s) {unknown}; the keys are {sorted(SHAPE_KEYS)}")
    if ("model" in shape) == ("llama" in shape):
        raise SystemExit(f"--shape {name}: give exactly one of model (a folder) and llama (dims)")
    if "llama" in shape:
        dims = shape.pop("llama")
        # the folder named by the dims too: a name given other dims in a later run gets a model of its own, not the old one
        digest = hashlib.sha256(json.dumps(dims, sort_keys=True).encode()).hexdigest()[:8]
        model = f"shape_{name}_{digest}"
        compare_trl.LLAMAS[model] = dims  # build_inputs writes it under /tmp/rlvr_bench
    else:
        model = str(Path(shape.pop("model")).resolve())
    CONFIGS[name] = {**compare_trl.CONFIGS["B"], "model": model, **shape}
    return name


def build_inputs(names: list[str]) -> dict:
    """compare_trl's models and prompt files under /tmp/rlvr_bench, the bundled tiny-tools and --shape models."""
    from rlvr.models import resolve_model_path

    paths = compare_trl.build_inputs([n for n in names if n in compare_trl.CONFIGS])
    paths["tiny-tools"] = resolve_model_path("tiny-tools")
    for n in names:
        if (model := CONFIGS[n]["model"]) in compare_trl.LLAMAS:  # G, I and --shape llamas
            paths[model] = str(compare_trl.WORK / model)
            compare_trl.build_llama(compare_trl.WORK / model, compare_trl.LLAMAS[model])
        elif Path(model).is_dir():  # a --shape model folder
            paths[model] = model
    return paths


def make_spec(name: str, paths: dict, a) -> dict:
    """A worker spec (compare_trl.rlvr_overrides reads it) for config `name`."""
    c = CONFIGS[name]
    return dict(
        model_path=paths[c["model"]],
        data=paths[f"data_{c['long_prompt']}"],
        reward=c["reward"],
        max_new_tokens=c["max_new_tokens"],
        fixed=c.get("fixed", True),
        group_size=c.get("group_size", compare_trl.G),
        prompts=c.get("prompts", compare_trl.PROMPTS),
        threads=a.threads,
        warmup=a.warmup,
        steps=a.steps,
        extra=compare_trl.rlvr_extra(c) + c.get("extra", []),
    )


# ----------------------------------------------------------------------------- the floor worker


def worker_floor(spec: dict) -> None:
    """The config's steps with the Linear hooks, each shape's product timed alone, the classic floor and the profile."""
    import torch

    from rlvr.config import load_config
    from rlvr.training import Trainer

    torch.set_num_threads(spec["threads"])
    with contextlib.suppress(ImportError):  # the floor counts the model's own products, not the decode's fused ones
        import rlvr.rollout.engines.hf.layer_products as layer_products

        layer_products.FUSE = False
    trainer = Trainer(load_config(None, compare_trl.rlvr_overrides(spec)), logger_live=False)
    shapes, last_call = floor_ops.LinearShapes(trainer.model), {}

    def in_phase(phase, fn):
        def wrapper(*args, **kwargs):
            shapes.phase = phase
            try:
                return fn(*args, **kwargs)
            finally:
                shapes.phase = "other"

        return wrapper

    def generate(prompts, params, seeds, _generate=trainer.engine.generate):
        last_call.update(prompts=list(prompts), params=params, seeds=list(seeds))  # what the profile decodes
        return _generate(prompts, params, seeds)

    trainer.engine.generate = in_phase("generation", generate)  # the rollout source holds the same engine
    if hasattr(trainer.engine, "generate_episodes"):  # multi-turn (H): its decode is generation too
        trainer.engine.generate_episodes = in_phase("generation", trainer.engine.generate_episodes)
    trainer.update = in_phase("training", trainer.update)
    tokens = []
    for _ in range(spec["warmup"] + spec["steps"]):  # warm-up steps too: the measured steps then see the same prompts
        shapes.begin_step()
        trainer.train_step()
        e = trainer.last_step.batch.episodes
        tokens.append({"completion": int(e.attention_mask.sum()), "prompt": int(e.prompt_mask[:: spec["group_size"]].sum())})
    shapes.remove()
    measured, tokens = shapes.steps[spec["warmup"] :], tokens[spec["warmup"] :]
    linears = [m for m in trainer.model.modules() if isinstance(m, torch.nn.Linear)]
    working_set = sum({id(m.weight): m.weight.numel() for m in linears}.values())
    keys = [(*k[1:5], p) for s in measured for k in s for p in k[5]]
    seconds = floor_ops.time_products(keys, working_set, spec["threads"])
    floor = floor_ops.step_floor(measured, seconds)
    # the classic floor, at the run's matmul precision
    dtype = "bf16" if trainer.precision.autocast == "bf16" else "fp32"
    peak = compare_trl.matmul_peaks(spec["threads"], (dtype,))[dtype]
    P = sum(m.weight.numel() for m in linears)
    gen = statistics.median(2 * P * t["completion"] for t in tokens)
    train = statistics.median(6 * P * (t["completion"] + t["prompt"]) for t in tokens)
    classic = {"params": P, "peak": peak, "dtype": dtype, "generation": gen / peak, "training": train / peak, "total": (gen + train) / peak}
    profile = {}
    if spec["profile"]:
        if last_call:  # single-turn; the multi-turn decode (continuous rows, tool turns) has no one step to profile
            profile["decode"] = floor_ops.profile_decode(trainer, last_call["prompts"], last_call["params"], last_call["seeds"])
        profile["micro_batch"] = floor_ops.profile_micro_batch(trainer)
    compare_trl._finish(
        {"floor": floor, "classic": classic, "tokens": tokens, "precision": trainer.precision.describe(), "profile": profile}
        | {"counts": floor_ops.counts_to_json(measured), "working_set": working_set, "seconds": _seconds_to_json(seconds)}
        | {"src": str(Path(sys.modules["rlvr"].__file__).parent)}
    )


def worker_retime(spec: dict) -> None:
    """The floor worker's products timed again (spec: its "seconds" keys, "working_set", "threads"), in a process of
    their own after the config's runs: main() keeps each product's faster time of the two."""
    keys = [tuple(k) for k, _ in spec["seconds"]]
    compare_trl._finish({"seconds": _seconds_to_json(floor_ops.time_products(keys, spec["working_set"], spec["threads"]))})


def _seconds_to_json(seconds: dict) -> list:
    return [[list(k), s] for k, s in seconds.items()]


def retimed_floor(rec: dict, again: dict) -> dict:
    """The floor worker's record with each product at the faster of its two timings (the worker's, `again`'s) and the
    floor recomputed from them; "timings" keeps both timings' floors of the step."""
    first = {tuple(k): s for k, s in rec["seconds"]}
    second = {tuple(k): s for k, s in again["seconds"]}
    steps = floor_ops.counts_from_json(rec["counts"])
    best = {k: min(s, second.get(k, s)) for k, s in first.items()}
    timings = [floor_ops.step_floor(steps, t)["total"]["seconds"] for t in (first, second)]  # the same products
    return {**rec, "floor": floor_ops.step_floor(steps, best), "seconds": _seconds_to_json(best), "timings": timings}


# ----------------------------------------------------------------------------- the driver


def run_worker(script: str, kind: str, spec: dict, src: Path, log) -> dict:
    """One worker process, rlvr from `src`, exactly spec["threads"] threads; its RESULT record."""
    n = str(spec["threads"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(HERE)]), OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)
    env.update(RLVR_BENCH_THREADS=n, TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore", TRANSFORMERS_VERBOSITY="error")
    rate = floor_ops.machine_rate(spec["threads"])
    load, t = compare_trl.load_average(), time.perf_counter()
    p = subprocess.run(
        [sys.executable, str(HERE / script), "--worker", kind, "--spec", json.dumps(spec)], env=env, capture_output=True, text=True
    )
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode or not lines:
        raise RuntimeError(f"{kind} worker failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    rec = json.loads(lines[-1][7:])
    rec.update(wall=time.perf_counter() - t, load=(load, compare_trl.load_average()))
    rec["rates"] = [rate, floor_ops.machine_rate(spec["threads"])]  # GFLOP/s just before and just after the process
    if "src" in rec and Path(rec["src"]).parent.resolve() != src.resolve():
        raise RuntimeError(f"the {kind} worker ran rlvr from {rec['src']}, not from {src}")
    rates = floor_ops.rates_text(rec["rates"])
    log(f"  {kind:6s} {src}: wall {rec['wall']:6.1f}s  load {load:.2f}->{rec['load'][1]:.2f}  {rates}  {rec.get('precision', '')}")
    return rec


@contextlib.contextmanager
def checkout(ref: str):
    """A temporary git worktree of `ref` (detached), removed after."""
    tmp = Path(tempfile.mkdtemp(prefix="rlvr_floor_"))
    tree = tmp / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True, capture_output=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def describe_version(ref: str | None) -> str:
    """`ref (short hash)` for a checked-out ref; for the working tree (None), its HEAD and whether src/ or bench/
    have uncommitted changes."""
    git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    if ref is None:
        dirty = git("status", "--porcelain", "--", "src", "bench")
        return f"this tree, HEAD {git('rev-parse', '--short', 'HEAD')}" + (" + uncommitted changes" if dirty else "")
    return f"{ref} ({git('rev-parse', '--short', ref)})"


def summarize(recs: list[dict]) -> dict:
    """Medians of generate/train/step over every measured step of every round, each round's step median, the precision."""
    steps = [s for r in recs for s in r["steps"]]
    out = {k: statistics.median(s[k] for s in steps) for k in TIMES}
    out.update(rounds=[statistics.median(s["step"] for s in r["steps"]) for r in recs], precision=sorted({r["precision"] for r in recs}))
    out["peak_rss_mb"] = [round(r["peak_rss_mb"]) for r in recs if "peak_rss_mb" in r]  # each round's process
    out["rates"] = [r["rates"] for r in recs]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="A,B,C,D,E,F")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="runs per version per config, alternating which version goes first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--before", help="a git ref: its src runs as 'before', beside this tree's ('after')")
    ap.add_argument("--after-extra", default="", help="rlvr overrides for 'after' only, comma-separated: with --before HEAD, a setting A/B")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True, help="per-op profile of the current code")
    ap.add_argument("--out", default=str(HERE / "results" / "floor.md"))
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=JSON", help="a config of your own (module docstring)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        {"floor": worker_floor, "retime": worker_retime}[a.worker](json.loads(a.spec))
        return
    import torch

    log_lines: list[str] = []

    def log(msg):
        print(msg, flush=True)
        log_lines.append(msg)

    for shape in a.shape:
        add_shape(shape)
    names = a.configs.split(",")
    if unknown := [n for n in names if n not in CONFIGS]:
        raise SystemExit(f"--configs: no config {unknown} (there are {sorted(CONFIGS)}; --shape adds one)")
    paths = build_inputs(names)
    head = {
        "command": "python bench/floor.py " + shlex.join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu": f"{cpu_name()}, {os.cpu_count()} cpus",
        "torch": torch.__version__,
        "threads": a.threads,
        "steps": f"{a.warmup} warm-up + {a.steps} measured steps per run, {a.rounds} round(s) per version",
        "versions": {"after": describe_version(None)} | ({"before": describe_version(a.before)} if a.before else {}),
        "busy_at_start": compare_trl.busy_processes(),
    }
    log(f"{head['cpu']}; torch {head['torch']}; {a.threads} threads; versions {head['versions']}")
    results: dict = {}
    after_extra = [x for x in a.after_extra.split(",") if x]
    if after_extra:
        head["versions"]["after"] += f" with {' '.join(after_extra)}"
    with checkout(a.before) if a.before else contextlib.nullcontext() as before_tree:
        srcs = {"after": ROOT / "src"} | ({"before": before_tree / "src"} if before_tree else {})
        for name in names:
            spec = make_spec(name, paths, a)
            log(f"config {name}: {spec['model_path']}, {spec['prompts']} x {spec['group_size']}, {spec['max_new_tokens']} new tokens")
            with tempfile.TemporaryDirectory() as out:
                floor = run_worker("floor.py", "floor", {**spec, "out": out, "profile": a.profile}, srcs["after"], log)
            runs: dict[str, list] = {v: [] for v in srcs}
            for rnd in range(a.rounds):
                for v in sorted(srcs, reverse=rnd % 2 == 1):  # after, before / before, after
                    extra = spec["extra"] + (after_extra if v == "after" else [])
                    with tempfile.TemporaryDirectory() as out:
                        runs[v].append(run_worker("compare_trl.py", "rlvr", {**spec, "out": out, "extra": extra}, srcs[v], log))
            # the products timed again after the runs, each keeping its faster time: a floor timed within one slow spell
            # of the machine (floor_ops.machine_rate) had put a run in a faster one at 0.8x its floor
            retime = {"threads": a.threads, "seconds": floor["seconds"], "working_set": floor["working_set"]}
            again = run_worker("floor.py", "retime", retime, srcs["after"], log)
            floor = retimed_floor(floor, again) | {"retime_rates": again["rates"]}
            results[name] = {"spec": spec, "floor": floor, "versions": {v: summarize(r) for v, r in runs.items()}, "runs": runs}
            write_report(Path(a.out), head, results, log_lines)  # partial results survive
    head["busy_at_end"] = compare_trl.busy_processes()
    write_report(Path(a.out), head, results, log_lines)


# ----------------------------------------------------------------------------- the report


def _precision(describe: str) -> str:
    """`bf16` from `precision: bf16 (why...)` (PrecisionChoice.describe)."""
    return describe.split(" (")[0].removeprefix("precision: ")


def _x(seconds: float, floor: float) -> str:
    return f"{seconds:.3f} | {seconds / floor:.1f}x" if floor else f"{seconds:.3f} | -"


def write_report(path: Path, head: dict, results: dict, log_lines: list[str]) -> None:
    versions = [v for v in ("before", "after") if v in head["versions"]]
    L = ["# rlvr against its matmul floor, CPU", ""]
    L.append(f"Command: `{head['command']}` ({head['date']})  ")
    L.append(f"Machine: {head['cpu']}; torch {head['torch']}; {head['threads']} threads per process, processes one after another.  ")
    L.append(f"Steps: {head['steps']}.  ")
    L.append("Versions: " + "; ".join(f"{v} = {head['versions'][v]}" for v in versions) + ".")
    busy = {b.split()[1]: b for b in head["busy_at_start"] + head.get("busy_at_end", [])}  # one line per pid
    if busy:
        L += ["", "> **The machine was not idle** (other busy processes): " + "; ".join(busy.values())]
    L += ["", "Floor: the step's own matmuls at their exact shapes, each timed alone (bench/floor.py's docstring). Medians.", ""]
    L.append(
        "The best round: the step median of each version's fastest round (processes run in the machine's faster spells "
        "and slower ones; the floor keeps each product's fastest time: floor_ops.machine_rate)."
    )
    L.append("")
    heads = [h for v in versions for h in (f"{v} step s (x floor)", f"{v} best round s (x floor)")]
    L.append(table_row("config", "precision", "floor gen / train / total s", *heads))
    L.append(table_row(*["---"] * (3 + 2 * len(versions))))
    for name, r in results.items():
        f = r["floor"]["floor"]
        fl = " / ".join(f"{f[p]['seconds']:.3f}" if p in f else "-" for p in ("generation", "training", "total"))
        total = f["total"]["seconds"]
        steps = (f"{s:.3f} ({s / total:.1f}x)" for v in versions for s in (r["versions"][v]["step"], min(r["versions"][v]["rounds"])))
        L.append(table_row(name, _precision(r["floor"]["precision"]), fl, *steps))
    for name, r in results.items():
        L += config_section(name, r, versions)
    for name, r in results.items():
        L += profile_section(name, r["floor"]["profile"])
    L += ["", "## Log", "", "```", *log_lines, "```", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(L))
    path.with_suffix(".json").write_text(json.dumps({**head, "results": results}, indent=1))
    print(f"wrote {path}")


def config_section(name: str, r: dict, versions: list[str]) -> list[str]:
    """One config: floor and rlvr's times side by side, the floor's products, the classic floor, the rounds."""
    rec, spec = r["floor"], r["spec"]
    f, c = rec["floor"], rec["classic"]
    L = ["", f"## Config {name}", ""]
    L.append(f"{spec['model_path']}, {spec['prompts']} prompts x {spec['group_size']}, {spec['max_new_tokens']} new tokens, ")
    L[-1] += f"extra overrides: {', '.join(spec['extra']) or 'none'}; {rec['precision']}."
    L += ["", table_row("", "floor s", *(f"{v} {h}" for v in versions for h in ("s", "x floor")))]
    L.append(table_row(*["---"] * (2 + 2 * len(versions))))
    for k in TIMES:
        fs = f.get(FLOOR_OF[k], {}).get("seconds", 0.0)
        L.append(table_row(FLOOR_OF[k].replace("total", "step (total)"), f"{fs:.3f}", *(_x(r["versions"][v][k], fs) for v in versions)))
    L.append("")
    if "training" not in f:
        L.append(
            "- training: no Linear call in the update (no rows trained: every group's rewards were equal, so all were skipped; "
            'a --shape with "extra": ["optim.skip_zero_advantage=false"] trains them, to time the update).'
        )
    for p in ("generation", "training", "other"):
        if p in f:
            rate = f[p]["gflop"] / f[p]["seconds"] if f[p]["seconds"] else 0
            L.append(
                f"- {p}: {len(f[p]['shapes'])} distinct products, {f[p]['gflop']:.2f} GFLOP per step, {rate:.0f} GFLOP/s over the floor."
            )
    L.append(
        f"- classic FLOP floor ({c['params'] / 1e6:.2f}M Linear params, {c['dtype']} peak {c['peak'] / 1e9:.0f} GFLOP/s): "
        f"generation {c['generation']:.3f} s, training {c['training']:.3f} s, total {c['total']:.3f} s."
    )
    if "timings" in rec:
        first, second = rec["timings"]
        L.append(
            f"- the floor's products timed twice, in the floor worker ({first:.3f} s a step) and again after the runs ({second:.3f} s), "
            "each product's faster time kept."
        )
    rates = [("floor worker", rec["rates"])]
    rates += [(f"{v} round {i + 1}", x) for v in versions for i, x in enumerate(r["versions"][v]["rates"])]
    rates += [("retimed floor", rec["retime_rates"])] if "retime_rates" in rec else []
    L.append(
        "- the machine's rate just before -> after each process (GFLOP/s of one 1024^3 fp32 product for 1 s, floor_ops.machine_rate): "
        + "; ".join(f"{who} {a:.0f} -> {b:.0f}" for who, (a, b) in rates)
        + "."
    )
    for v in versions:
        if r["versions"][v]["step"] < f["total"]["seconds"]:
            L.append(
                f"- **{v}'s step is under its floor**: the products ran faster in the run than in both timings of them alone; "
                "the rates above say whether the machine was faster then."
            )
    for v in versions:
        x = r["versions"][v]
        ran = sorted({_precision(p) for p in x["precision"]})
        note = (
            "" if ran == [_precision(rec["precision"])] else " **not the floor worker's precision: the multiples compare different work**"
        )
        rss = f"; peak RSS per round {', '.join(f'{m} MiB' for m in x['peak_rss_mb'])}" if x.get("peak_rss_mb") else ""
        L.append(f"- {v}: step medians per round {', '.join(f'{s:.3f}' for s in x['rounds'])} s{rss}; precision {', '.join(ran)}{note}.")
    return L


def profile_section(name: str, prof: dict) -> list[str]:
    """One config's profile: ms per decode step and per training micro-batch, by category."""
    parts = [(k, prof[k]) for k in ("decode", "micro_batch") if prof.get(k)]
    if not parts:
        return []
    L = ["", f"### Profile of config {name} (after)", ""]
    if d := prof.get("decode"):
        L.append(f"Decode step: {d['rows']} rows, mean of {d['steps']} steps from mid-decode.  ")
    m = prof.get("micro_batch")
    L.append(
        f"Micro-batch: {m['rows']} rows, {m['tokens']} tokens (prompt + completion)." if m else "Micro-batch: the step trained no rows."
    )
    L += ["", table_row("category", *(f"{k.replace('_', '-')} ms | share" for k, _ in parts))]
    L.append(table_row(*["---"] * (1 + 2 * len(parts))))
    for cat in floor_ops.CATEGORIES:
        cells = []
        for _, x in parts:
            s = x["categories"].get(cat, 0.0)
            rate = f" ({x['matmul_gflops']:.0f} GFLOP/s)" if cat == "matmul" and x["matmul_gflops"] else ""
            cells.append(f"{s * 1e3:.2f}{rate} | {s / x['wall']:.0%}")
        L.append(table_row(cat, *cells))
    L.append(table_row("wall (without the profiler)", *(f"{x['wall'] * 1e3:.2f} ({x['wall_plain'] * 1e3:.2f}) | 100%" for _, x in parts)))
    if all("faults" in x for _, x in parts):  # reports before the page-fault retries have none
        L.append(
            table_row(
                "page faults (without the profiler)",
                *(f"{x['faults']} ({x['faults_plain']}) | {x['tries']} {'try' if x['tries'] == 1 else 'tries'}" for _, x in parts),
            )
        )
    return L


if __name__ == "__main__":
    main()
