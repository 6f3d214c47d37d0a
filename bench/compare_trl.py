"""rlvr vs TRL's GRPOTrainer on identical work, on CPU.

    python bench/compare_trl.py                      # all configs, writes bench/results/vs_trl.md
    python bench/compare_trl.py --configs A,B --steps 8 --warmup 2
    python bench/compare_trl.py --configs S1 --shape 'S1={"llama": {...}, "prompts": 16, ...}'   # a shape of your own (bench/floor.py)

Both libraries get the same model files, prompts (chat messages rendered by the same template),
group size (G=8), prompts per step (8), max new tokens, AdamW (lr 1e-6, betas 0.9/0.999, constant
schedule, grad-norm clip 1.0), beta=0, mu=1, temperature 1, dapo loss, group-std scaling (ddof=1,
as TRL). Every library runs in its own subprocess (peak RSS is separable), with exactly 2 threads,
strictly one after the other, alternating which goes first from round to round.

Precision: each library at its best on this machine unless the config says otherwise: rlvr with
model.autocast=auto (it times fp32 and bf16 on the model at start-up and runs the faster; the
choice is in the log), TRL with bf16=True only where this machine's bf16 matmul peak beats fp32's
(measured first; CPUs without native bf16 emulate it, many times slower).

Configs (8 prompts x G=8 per step unless said):
  A  bundled `tiny` model on arithmetic, 16 new tokens, arithmetic reward (0/1); each at its best precision
  B  25M Llama (hidden 512, 8 layers, 8 heads, intermediate 1376), char tokenizer, 64 new tokens; each at its best
  C  as B with ~256-token prompts (a long fixed instruction before each question); each at its best
  D  as B, TRL at its own defaults (bf16 autocast on CPU + gradient checkpointing) vs rlvr's best
     (model.autocast=auto, micro-batches of 16)
  E  76M GQA Llama (hidden 768, 12 layers, 12 query / 4 KV heads, intermediate 2048), 64 new tokens; each at its best
  F  9M GQA Llama (hidden 320, 8 layers, 8 query / 2 KV heads, intermediate 864), 4 prompts x G=16, C's ~256-token
     prompts, 48 new tokens; each at its best (E and F: bench/floor.py's two other shapes)
  G  as E with LoRA adapters (peft, r=16, alpha=32, every Linear, the base frozen) in both; each at its best
  B16 (extra) as B with both in bf16 autocast, no checkpointing: what bf16 alone gives each library
B-F use `digit_share` (continuous: every group has signal, so rlvr's zero-advantage skip never
applies there). Variant `fixed`: EOS ignored, every completion exactly max_new_tokens long in
both (rlvr: rollout.ignore_eos; TRL: generation_kwargs min_new_tokens=max_new_tokens); variant
`eos`: normal stopping (different samples, so similar but not identical work).

The compute floor: FLOPs = 6 x params x trained tokens + 2 x params x generated tokens, where
trained tokens = completion tokens + each prompt's tokens once (the least a training forward must
see), over the matmul peak (2048^3, 2 threads) measured in this run, fp32 and bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = Path(tempfile.gettempdir()) / "rlvr_bench"
THREADS = int(os.environ.get("RLVR_BENCH_THREADS", "2"))  # 2 for every reported number
G, PROMPTS = 8, 8
LR = 1e-6
LONG_INSTRUCTION = (  # with the chat template and a question, prompts of ~256 tokens
    "You are a careful calculator. Read the question below and work out the value of the expression "
    "exactly, using integer arithmetic only. Reply with the final number alone: no words, no units, "
    "no punctuation. Answer now, as briefly as you can. "
)
MID_INSTRUCTION = "Work out the value exactly; reply with the number alone. "  # prompts of ~75 tokens (bench/floor.py "mid")

RLVR_PYTHON = ""  # --rlvr-python: run the rlvr worker in another virtualenv
WORKER_TIMEOUT = 0.0  # --worker-timeout

CONFIGS = {
    "A": dict(model="tiny", reward="arithmetic", max_new_tokens=16, long_prompt=False, trl_defaults=False),
    "B": dict(model="llama25m", reward="digit_share", max_new_tokens=64, long_prompt=False, trl_defaults=False),
    "C": dict(model="llama25m", reward="digit_share", max_new_tokens=64, long_prompt=True, trl_defaults=False),
    "D": dict(model="llama25m", reward="digit_share", max_new_tokens=64, long_prompt=False, trl_defaults=True),
    # the floor bench's two other shapes (bench/floor.py): a larger model with short prompts, a smaller one with long
    "E": dict(model="llama76m_gqa", reward="digit_share", max_new_tokens=64, long_prompt=False, trl_defaults=False),
    "F": dict(model="llama9m_gqa", reward="digit_share", max_new_tokens=48, long_prompt=True, trl_defaults=False, prompts=4, group_size=16),
    # E with rank-16 LoRA on every projection (bench/floor.py's G): peft's adapters in both libraries
    "G": dict(model="llama76m_gqa", reward="digit_share", max_new_tokens=64, long_prompt=False, trl_defaults=False, lora=(16, 32)),
    # B's batch on a 32000-token vocabulary (bench/floor.py's V): the vocabulary-wide log-probs, entropy and sampling
    "V": dict(model="llama20m_v32k", reward="digit_share", max_new_tokens=64, long_prompt=False, trl_defaults=False),
    # not in the issue: B with both libraries in bf16 autocast (TRL without checkpointing), to separate
    # what bf16 gives from what rlvr gives in D
    "B16": dict(model="llama25m", reward="digit_share", max_new_tokens=64, long_prompt=False, trl_defaults=False, bf16=True),
}
# rlvr's fast paths that change no math are on by default (zero-advantage skip, shared-prefix
# training forward, preallocated KV cache), and so is its precision by measurement
# (model.autocast=auto). Config D ("best") adds micro-batches of 16 completions (so that its peak
# RSS stays under TRL's with gradient checkpointing; about as fast as the whole batch at once);
# B16 runs both libraries in bf16 autocast, nothing else changed.
RLVR_BEST = ["optim.micro_batch_size=16"]
RLVR_BF16 = ["model.autocast=bf16"]
# config B's model (C and D too): 25M parameters
LLAMAS = {  # random-weight Llamas on the character tokenizer, built under WORK
    "llama25m": dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8),
    "llama76m_gqa": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4),
    "llama9m_gqa": dict(hidden_size=320, intermediate_size=864, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2),
    # floor.py's V: a real tokenizer's vocabulary on a small model (the lm_head is 72 % of its Linear parameters)
    "llama20m_v32k": dict(
        hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=32000
    ),
    # floor.py's L: V's body on the character vocabulary, for long generations (the KV cache grows to 264 slots a row)
    "llama3m_gqa": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2),
}


# ----------------------------------------------------------------------------- the machine


def _proc_times() -> dict[int, tuple[str, int]]:
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            out[int(d)] = (name, int(fields[11]) + int(fields[12]))
        except (OSError, ValueError, IndexError):
            pass
    return out


def busy_processes(window: float = 1.0, threshold: float = 0.1) -> list[str]:
    """Other processes using more than `threshold` of a core over `window` seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    a = _proc_times()
    time.sleep(window)
    b = _proc_times()
    me = os.getpid()
    busy = []
    for pid, (name, t) in b.items():
        if pid == me or pid not in a:
            continue
        share = (t - a[pid][1]) / tick / window
        if share > threshold:
            cmd = (
                Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:90]
                if Path(f"/proc/{pid}/cmdline").exists()
                else name
            )
            busy.append(f"pid {pid} {share:.0%} cpu: {cmd.strip() or name}")
    return busy


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# ----------------------------------------------------------------------------- shared inputs


def build_inputs(cfg_names: list[str]) -> dict:
    """Model folders and prompt datasets, written once under /tmp/rlvr_bench."""
    from rlvr.tasks import arithmetic as ar
    from rlvr.models import resolve_model_path

    WORK.mkdir(parents=True, exist_ok=True)
    paths = {"tiny": resolve_model_path("tiny")}
    for name in {CONFIGS[c]["model"] for c in cfg_names} & set(LLAMAS):
        build_llama(WORK / name, LLAMAS[name])
    paths |= {name: str(WORK / name) for name in LLAMAS}
    n = 200  # more than (warmup + steps) x prompts per step
    for long, (name, instruction) in {False: ("short", ""), True: ("long", LONG_INSTRUCTION), "mid": ("mid", MID_INSTRUCTION)}.items():
        rows = []
        for i in range(n):
            p = ar.problem_at(i, "train", seed=0)
            q = (instruction + "Question: " if instruction else "") + p.question
            rows.append({"prompt": [{"role": "user", "content": q}], "answer": str(p.answer)})
        f = WORK / f"prompts_{name}.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths[f"data_{long}"] = str(f)
    return paths


def build_llama(path: Path, dims: dict) -> None:
    """A random-weight Llama on the character tokenizer at `path` (bench/_models.py), built once.
    `dims`: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads."""
    from _models import char_llama

    char_llama(path, dims)


def n_params(model_path: str) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    # the input embedding is a lookup (no FLOPs); the output projection is a matmul
    emb = m.get_input_embeddings().weight
    return sum(p.numel() for p in m.parameters() if p is not emb)


# ----------------------------------------------------------------------------- workers


def _finish(rec: dict) -> None:
    rec["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(rec), flush=True)


def rlvr_overrides(spec: dict) -> list[str]:
    """rlvr's config overrides for a worker spec: the shared settings of the module docstring, then spec["extra"].
    `group_size`, `prompts` and `threads` default to this file's G, PROMPTS and THREADS (bench/floor.py sets its own)."""
    return [
        f"model.path={spec['model_path']}",
        "data.task=null",
        f"data.path={spec['data']}",
        "data.shuffle=false",
        f"rewards=[{HERE / 'bench_rewards.py'}:{spec['reward']}]",
        f"rollout.group_size={spec.get('group_size', G)}",
        f"rollout.prompts_per_step={spec.get('prompts', PROMPTS)}",
        f"rollout.max_new_tokens={spec['max_new_tokens']}",
        "rollout.temperature=1.0",
        f"rollout.ignore_eos={spec['fixed']}",
        f"optim.lr={LR}",
        "optim.beta2=0.999",
        "optim.max_grad_norm=1.0",
        "optim.lr_schedule=constant",
        "algo.beta=0",
        "algo.num_iterations=1",
        "algo.loss_type=dapo",
        "algo.clip_cov_ratio=0",  # TRL has no Clip-Cov (rlvr's default since 2026-12-03): the same loss on both sides
        "algo.std_ddof=1",
        f"threads={spec.get('threads', THREADS)}",
        "device=cpu",
        "eval_before_after=false",
        "log_completions_every=0",
        "report_to=[]",
        "doctor_every=0",
        f"steps={spec['warmup'] + spec['steps']}",
        f"output_dir={spec['out']}",
        "seed=0",
        *spec["extra"],
    ]


def rlvr_extra(config: dict) -> list[str]:
    """rlvr's overrides particular to a config: D's micro-batches (RLVR_BEST), B16's bf16 (RLVR_BF16), G's LoRA."""
    lora = [f"model.lora.r={config['lora'][0]}", f"model.lora.alpha={config['lora'][1]}"] if config.get("lora") else []
    return (RLVR_BEST if config["trl_defaults"] else RLVR_BF16 if config.get("bf16") else []) + lora


def worker_rlvr(spec: dict) -> None:
    import torch

    torch.set_num_threads(spec.get("threads", THREADS))
    sys.path.insert(0, str(HERE))
    import bench_rewards

    from rlvr.config import load_config
    from rlvr.training import Trainer

    overrides = rlvr_overrides(spec)
    trainer = Trainer(load_config(None, overrides), logger_live=False)
    steps = []
    for _ in range(spec["warmup"] + spec["steps"]):
        bench_rewards.SEEN_LENGTHS.clear()
        m = trainer.train_step()
        e = trainer.last_step.batch.episodes
        steps.append(
            {
                "step": m["time/step"],
                "generate": m["time/generate"],
                "reward": m["time/reward"],
                "train": m["time/train"],
                "completion_tokens": int(e.attention_mask.sum()),
                "prompt_tokens": int(e.prompt_mask[:: spec.get("group_size", G)].sum()),
                "min_len": int(e.lengths.min()),
                "max_len": int(e.lengths.max()),
                "frac_zero_std": m.get("frac_reward_zero_std"),
            }
        )
    settings = (overrides[-len(spec["extra"]) :] if spec["extra"] else []) + [f"precision={trainer.precision.name}"]
    src = str(Path(sys.modules["rlvr"].__file__).parent)  # the source tree that ran (bench/floor.py runs two)
    _finish({"lib": "rlvr", "steps": steps[spec["warmup"] :], "settings": settings, "precision": trainer.precision.describe(), "src": src})


def worker_trl(spec: dict) -> None:
    import torch

    torch.set_num_threads(THREADS)
    sys.path.insert(0, str(HERE))
    import bench_rewards
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    T = spec["max_new_tokens"]
    group_size, prompts = spec.get("group_size", G), spec.get("prompts", PROMPTS)
    rows = [json.loads(line) for line in Path(spec["data"]).read_text().splitlines()]
    total = spec["warmup"] + spec["steps"]
    kwargs = {}
    if not spec["trl_defaults"]:  # its best precision here (or bf16 in B16), no checkpointing
        kwargs.update(bf16=spec["bf16"], gradient_checkpointing=False)
    args = GRPOConfig(
        output_dir=spec["out"],
        per_device_train_batch_size=group_size * prompts,
        gradient_accumulation_steps=1,
        num_generations=group_size,
        max_completion_length=T,
        max_steps=total,
        learning_rate=LR,
        lr_scheduler_type="constant",
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        weight_decay=0.0,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",
        scale_rewards="group",
        temperature=1.0,
        use_cpu=True,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        log_completions=False,
        generation_kwargs={"min_new_tokens": T} if spec["fixed"] else None,
        **kwargs,
    )
    tok = AutoTokenizer.from_pretrained(spec["model_path"])
    if spec.get("lora"):  # as rlvr's model.lora: every Linear but the lm_head
        from peft import LoraConfig

        r, alpha = spec["lora"]
        kwargs = {"peft_config": LoraConfig(r=r, lora_alpha=alpha, target_modules="all-linear", task_type="CAUSAL_LM")}
    else:
        kwargs = {}
    trainer = GRPOTrainer(
        model=spec["model_path"],
        reward_funcs=[getattr(bench_rewards, spec["reward"])],
        args=args,
        train_dataset=Dataset.from_list(rows[: total * prompts]),
        processing_class=tok,
        **kwargs,
    )
    cur = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                cur[name] = cur.get(name, 0.0) + time.perf_counter() - t

        return wrapper

    trainer._generate = timed("generate", trainer._generate)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    steps = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            cur.clear()
            bench_rewards.SEEN_LENGTHS.clear()
            cur["t0"] = time.perf_counter()

        def on_step_end(self, *a, **k):
            step = time.perf_counter() - cur["t0"]
            gen = cur.get("generate", 0.0)  # rewards are scored outside _generate
            lens = list(bench_rewards.SEEN_LENGTHS)
            steps.append(
                {
                    "step": step,
                    "generate": gen,
                    "reward": cur.get("reward", 0.0),
                    "train": step - gen - cur.get("reward", 0.0),
                    "completion_tokens": sum(lens),
                    "min_len": min(lens) if lens else None,
                    "max_len": max(lens) if lens else None,
                }
            )

    trainer.add_callback(Clock())
    trainer.train()
    _finish(
        {
            "lib": "trl",
            "steps": steps[spec["warmup"] :],
            "settings": [f"bf16={trainer.args.bf16}", f"gradient_checkpointing={trainer.args.gradient_checkpointing}"],
        }
    )


def matmul_peaks(threads: int = THREADS, names: tuple[str, ...] = ("fp32", "bf16")) -> dict:
    """FLOP/s of the best 2048^3 product on `threads` threads, per precision in `names`: {"fp32": ..., "bf16": ...}."""
    import torch

    torch.set_num_threads(threads)
    out = {}
    n = 2048
    for name in names:
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
        t = time.perf_counter()
        a @ b
        first = time.perf_counter() - t
        # CPUs without native bf16 (no avx512_bf16/amx) take seconds, or a minute, per product: fewer repetitions
        reps = 8 if first < 0.5 else 2 if first < 5 else 0
        best = 2 * n**3 / first
        for _ in range(reps):
            t = time.perf_counter()
            for _ in range(4 if reps == 8 else 1):
                a @ b
            best = max(best, (4 if reps == 8 else 1) * 2 * n**3 / (time.perf_counter() - t))
        out[name] = best
    return out


def worker_peak(spec: dict) -> None:
    _finish({"lib": "peak", "flops": matmul_peaks()})


# ----------------------------------------------------------------------------- driver


def run_worker(kind: str, spec: dict, log) -> dict:
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(THREADS),
        MKL_NUM_THREADS=str(THREADS),
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
        TRANSFORMERS_VERBOSITY="error",
    )
    # the machine's speed just before and after (floor_ops.machine_rate): one library's run in a fast spell and the
    # other's in a slow one moves their ratio by up to ~1.5x on a shared VM
    from floor_ops import machine_rate, rates_text

    rate = machine_rate(THREADS)
    before, busy = load_average(), busy_processes()
    t = time.perf_counter()
    python = RLVR_PYTHON if kind == "rlvr" and RLVR_PYTHON else sys.executable
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # rollout.engine=vllm on CPU: a small KV cache is plenty here
    try:
        p = subprocess.run(
            [python, __file__, "--worker", kind, "--spec", json.dumps(spec)],
            env=env,
            capture_output=True,
            text=True,
            timeout=WORKER_TIMEOUT or None,
        )
    except subprocess.TimeoutExpired:  # e.g. TRL's bf16 default on a CPU that emulates bf16: a lower bound, not a time
        log(
            f"  {kind:5s} killed after {WORKER_TIMEOUT:.0f} s (--worker-timeout) before finishing "
            f"{spec.get('warmup', 0)} + {spec.get('steps', 0)} steps"
        )
        return {
            "timed_out": WORKER_TIMEOUT,
            "steps": [],
            "peak_rss_mb": float("nan"),
            "settings": ["killed at the time limit"],
            "load_before": before,
            "load_after": load_average(),
            "busy_before": busy,
            "wall": WORKER_TIMEOUT,
            "rates": [rate, machine_rate(THREADS)],
        }
    wall = time.perf_counter() - t
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode or not lines:
        raise RuntimeError(f"{kind} worker failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    rec = json.loads(lines[-1][7:])
    rec.update(load_before=before, load_after=load_average(), busy_before=busy, wall=wall, rates=[rate, machine_rate(THREADS)])
    busy_text = f"  BUSY: {busy}" if busy else ""
    log(f"  {kind:5s} wall {wall:6.1f}s  load {before:.2f}->{rec['load_after']:.2f}  {rates_text(rec['rates'])}{busy_text}")
    if "precision" in rec:
        log(f"        {rec['precision']}")
    return rec


def summarize(rec: dict) -> dict:
    s = rec["steps"]
    if not s:  # killed at --worker-timeout: every step took at least timeout / steps run
        bound = rec["timed_out"] / max(1, rec["steps_asked"])
        nan = float("nan")
        return {
            "median": bound,
            "min": bound,
            "max": nan,
            "n": 0,
            "lower_bound": True,
            "generate": nan,
            "reward": nan,
            "train": nan,
            "tokens": nan,
            "tok_per_s": nan,
            "rss": nan,
            "min_len": "-",
            "max_len": "-",
            "prompt_tokens": nan,
        }
    times = [x["step"] for x in s]
    med = statistics.median(times)
    tokens = statistics.median(x["completion_tokens"] for x in s)
    return {
        "median": med,
        "min": min(times),
        "max": max(times),
        "n": len(times),
        "generate": statistics.median(x["generate"] for x in s),
        "reward": statistics.median(x["reward"] for x in s),
        "train": statistics.median(x["train"] for x in s),
        "tokens": tokens,
        "tok_per_s": tokens / med,
        "rss": rec["peak_rss_mb"],
        "min_len": min(x["min_len"] for x in s if x["min_len"] is not None),
        "max_len": max(x["max_len"] for x in s if x["max_len"] is not None),
        "prompt_tokens": statistics.median(x.get("prompt_tokens", 0) for x in s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="A,B,C,D,E,F,B16")
    ap.add_argument("--variants", default="fixed", help="variants run for every config: fixed (EOS ignored), eos (normal stopping)")
    ap.add_argument("--eos-configs", default="A,B", help="configs that also run the eos variant")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="runs per library per config, alternating which goes first")
    ap.add_argument("--rlvr-extra", default="", help="extra rlvr overrides for every config, comma-separated")
    ap.add_argument(
        "--rlvr-python", default="", help="python of another virtualenv to run rlvr in (e.g. .venv-vllm for rollout.engine=vllm on CPU)"
    )
    ap.add_argument("--out", default=str(HERE / "results" / "vs_trl.md"))
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=JSON", help="as bench/floor.py's (extra: rlvr's only)")
    ap.add_argument(
        "--worker-timeout",
        type=float,
        default=0,
        help="kill a library's run after this many seconds and report its step time as a lower bound (0: no limit)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    a = ap.parse_args()
    global RLVR_PYTHON, WORKER_TIMEOUT
    RLVR_PYTHON, WORKER_TIMEOUT = a.rlvr_python, a.worker_timeout
    if a.worker:
        {"rlvr": worker_rlvr, "trl": worker_trl, "peak": worker_peak}[a.worker](json.loads(a.spec))
        return

    log_lines: list[str] = []

    def log(msg):
        print(msg, flush=True)
        log_lines.append(msg)

    if a.shape:
        import floor  # imports this module: here, at run time

        for shape in a.shape:  # floor registers its model in the module compare_trl, not in this __main__
            name = floor.add_shape(shape)
            CONFIGS[name] = floor.CONFIGS[name]
            LLAMAS.update(floor.compare_trl.LLAMAS)
    names = a.configs.split(",")
    paths = build_inputs(names)
    import torch
    import transformers
    import trl

    versions = (
        f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}"
    )
    if a.rlvr_python:
        other = subprocess.run(
            [
                a.rlvr_python,
                "-c",
                "import torch, transformers; v = [torch.__version__, transformers.__version__]\n"
                "try:\n import vllm; v.append(vllm.__version__)\nexcept ImportError: v.append('-')\nprint(*v)",
            ],
            capture_output=True,
            text=True,
        ).stdout.split()
        versions += f"; rlvr ran in {a.rlvr_python}: torch {other[0]}, transformers {other[1]}, vllm {other[2]}"
    from rlvr.models.precision_choice import cpu_model

    cpu = cpu_model()
    flags = Path("/proc/cpuinfo").read_text()
    isa = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    log(f"{versions}; {cpu} ({os.cpu_count()} cpus, {' '.join(isa)}); {THREADS} threads")
    start_load, start_busy = load_average(), busy_processes(2.0)
    log(f"load average at start {start_load:.2f}; busy processes: {start_busy or 'none'}")
    peak = run_worker("peak", {}, log)["flops"]
    log(
        f"matmul peak: fp32 {_gflops(peak['fp32'])} GFLOP/s, bf16 {_gflops(peak['bf16'])} GFLOP/s; TRL's best precision here: "
        f"{_trl_best(peak)} (bf16=True only where the bf16 peak is the higher)"
    )

    results = []
    for name in names:
        c = CONFIGS[name]
        mp = paths[c["model"]]
        params = n_params(mp)
        variants = a.variants.split(",") + (["eos"] if name in a.eos_configs.split(",") and "eos" not in a.variants else [])
        for variant in variants:
            spec = dict(
                model_path=mp,
                data=paths[f"data_{c['long_prompt']}"],
                reward=c["reward"],
                max_new_tokens=c["max_new_tokens"],
                group_size=c.get("group_size", G),
                prompts=c.get("prompts", PROMPTS),
                fixed=variant == "fixed",
                trl_defaults=c["trl_defaults"],
                lora=c.get("lora"),
                bf16=c.get("bf16", False) or _trl_best(peak) == "bf16",
                steps=a.steps,
                warmup=a.warmup,
            )
            extra = [x for x in a.rlvr_extra.split(",") if x] + rlvr_extra(c) + c.get("extra", [])
            log(f"config {name} ({variant}): {mp}, {params / 1e6:.2f}M params")
            runs = {"trl": [], "rlvr": []}
            for rnd in range(a.rounds):
                order = ("trl", "rlvr") if rnd % 2 == 0 else ("rlvr", "trl")
                for lib in order:
                    with tempfile.TemporaryDirectory() as out:
                        runs[lib].append(run_worker(lib, {**spec, "out": out, "extra": extra}, log))
            merged = {}
            for lib, recs in runs.items():
                rec = {
                    "steps": [s for r in recs for s in r["steps"]],
                    "peak_rss_mb": max(r["peak_rss_mb"] for r in recs),
                    "timed_out": max(r.get("timed_out", 0) for r in recs),
                    "steps_asked": a.warmup + a.steps,
                }
                merged[lib] = summarize(rec) | {
                    "settings": recs[0]["settings"],
                    "load": [(r["load_before"], r["load_after"]) for r in recs],
                    "rates": [r["rates"] for r in recs],  # the machine's rate just before and after each run
                    "busy": [b for r in recs for b in r["busy_before"]],
                }
            rl = merged["rlvr"]
            trained = rl["tokens"] + rl["prompt_tokens"]
            flops = {"gen": 2 * params * rl["tokens"], "train": 6 * params * trained}
            flops["step"] = flops["gen"] + flops["train"]
            results.append({"config": name, "variant": variant, "params": params, "flops": flops, **merged})
            r = results[-1]
            log(f"  -> TRL {r['trl']['median']:.3f}s  rlvr {rl['median']:.3f}s  ratio {r['trl']['median'] / rl['median']:.2f}")
            save(results, peak, versions, cpu, isa, (start_load, start_busy, None, []), log_lines, a)  # partial results survive
    end_load, end_busy = load_average(), busy_processes(2.0)
    log(f"load average at end {end_load:.2f}; busy processes: {end_busy or 'none'}")
    save(results, peak, versions, cpu, isa, (start_load, start_busy, end_load, end_busy), log_lines, a)


def _gflops(flops: float) -> str:
    """FLOP/s as GFLOP/s, two significant digits below 10 (emulated bf16 runs at well under 1)."""
    g = flops / 1e9
    return f"{g:.0f}" if g >= 10 else f"{g:.2g}"


def _trl_best(peak: dict) -> str:
    """The precision TRL runs fastest in on this machine, by the matmul peaks: bf16 or fp32."""
    return "bf16" if peak["bf16"] > peak["fp32"] else "fp32"


def save(results, peak, versions, cpu, isa, loads, log_lines, a) -> None:
    env = f"RLVR_BENCH_THREADS={THREADS} " if THREADS != 2 else ""
    cmd = env + "python bench/compare_trl.py " + " ".join(sys.argv[1:])
    write_report(Path(a.out), results, peak, versions, cpu, isa, cmd.strip(), loads, log_lines, a)
    Path(a.out).with_suffix(".json").write_text(json.dumps({"peak": peak, "results": results}, indent=1))


def write_report(path: Path, results, peak, versions, cpu, isa, cmd, loads, log_lines, a) -> None:
    start_load, start_busy, end_load, end_busy = loads
    end_busy = end_busy or []
    busy_any = start_busy or end_busy or any(r[lib]["busy"] for r in results for lib in ("trl", "rlvr"))
    L = ["# rlvr vs TRL GRPOTrainer, same work, CPU", ""]
    L.append(f"Command: `{cmd}` ({time.strftime('%Y-%m-%d %H:%M')})  ")
    L.append(f"Versions: {versions}  ")
    L.append(f"Machine: {cpu}, {os.cpu_count()} cpus ({' '.join(isa)}), {THREADS} threads per run, runs strictly one after another.  ")
    L.append(f"Steps: {a.warmup} warm-up + {a.steps} measured per run, {a.rounds} round(s) per library (alternating order).  ")
    L.append(
        f"Load average: {start_load:.2f} at start, "
        + (f"{end_load:.2f} at end.  " if end_load is not None else "(run still in progress: partial results).  ")
    )
    L.append(f"Matmul peak (2048^3, {THREADS} threads): fp32 {_gflops(peak['fp32'])} GFLOP/s, bf16 {_gflops(peak['bf16'])} GFLOP/s.  ")
    L.append(
        f"Precision, unless the config sets it (D: TRL's defaults, B16: both bf16): each library at its best here: "
        f"TRL {_trl_best(peak)} (by the peaks), rlvr model.autocast=auto (its choice per config under Settings and in the log)."
    )
    L.append("")
    if busy_any:
        L.append("> **WARNING: the machine was not idle during (part of) this run.** Other busy processes:")
        for b in sorted(set(start_busy + end_busy + [b for r in results for lib in ("trl", "rlvr") for b in r[lib]["busy"]])):
            L.append(f"> - {b}")
        L.append("")
    L.append(
        "| config | variant | lib | step median (min-max) s | generate s | reward s | train s "
        "| completion tok/s | len min-max | peak RSS MB | TRL/rlvr |"
    )
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for lib in ("trl", "rlvr"):
            x = r[lib]
            bound = "> " if r["trl"].get("lower_bound") else ""  # TRL killed at --worker-timeout: its time and the ratio are lower bounds
            ratio = f"**{bound}{r['trl']['median'] / r['rlvr']['median']:.2f}**" if lib == "rlvr" else ""
            step = f"> {x['median']:.0f} (killed)" if x.get("lower_bound") else f"{x['median']:.3f} ({x['min']:.3f}-{x['max']:.3f})"
            L.append(
                f"| {r['config']} | {r['variant']} | {lib} | {step} | {x['generate']:.3f} | "
                f"{x['reward']:.3f} | {x['train']:.3f} | {x['tok_per_s']:.0f} | {x['min_len']}-{x['max_len']} | {x['rss']:.0f} | {ratio} |"
            )
    L += [
        "",
        "## Compute floor",
        "",
        "FLOPs = 6 x params x trained tokens + 2 x params x generated tokens (params without the input embedding; trained tokens = "
        "completion tokens + each prompt once; attention FLOPs not counted). Floor time = FLOPs / matmul peak. "
        "Share = floor time / measured time (1.0 = at the peak).",
        "",
        "| config | variant | params M | gen GFLOP | train GFLOP | floor fp32 s (gen / step) | floor bf16 s (gen / step) | "
        "TRL share fp32 | rlvr share fp32 | rlvr share bf16 | rlvr gen / gen floor (fp32) | rlvr step / step floor (fp32) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        f = r["flops"]
        fl32 = {k: v / peak["fp32"] for k, v in f.items()}
        fl16 = {k: v / peak["bf16"] for k, v in f.items()}
        L.append(
            f"| {r['config']} | {r['variant']} | {r['params'] / 1e6:.2f} | {f['gen'] / 1e9:.0f} | {f['train'] / 1e9:.0f} | "
            f"{fl32['gen']:.2f} / {fl32['step']:.2f} | {fl16['gen']:.2f} / {fl16['step']:.2f} | {fl32['step'] / r['trl']['median']:.2f} | "
            f"{fl32['step'] / r['rlvr']['median']:.2f} | {fl16['step'] / r['rlvr']['median']:.2f} | "
            f"{r['rlvr']['generate'] / fl32['gen']:.2f}x | {r['rlvr']['median'] / fl32['step']:.2f}x |"
        )
    L += [
        "",
        "Settings per run: "
        + "; ".join(
            sorted({f"{r['config']} {lib}: {', '.join(r[lib]['settings']) or 'defaults'}" for r in results for lib in ("trl", "rlvr")})
        ),
        "",
        "## Log",
        "",
        "```",
        *log_lines,
        "```",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(L))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
