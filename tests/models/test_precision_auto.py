"""model.autocast=auto: the faster precision, timed once per model, machine and shapes, is the one
every forward of the run (generation and update) runs under; bf16/none are followed untimed."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from rlvr.models import precision_choice, precision_timing, resolve_model_path
from rlvr.models.precision import autocast_context
from rlvr.models.precision_choice import cache_key, choose_precision
from rlvr.models.precision_timing import StepShapes, StepTimes, measure_step

SHAPES = StepShapes(rows_per_backward=8, trained_rows=16, prompt_tokens=12, completion_tokens=4, decoded_rows=16)


class StubTimer:
    """Stands in for precision_timing.measure_step: fixed per-step seconds, and the calls it got."""

    def __init__(self, fp32: float, bf16: float):
        self.seconds, self.calls = {"none": fp32, "bf16": bf16}, []

    def __call__(self, model, shapes):
        self.calls.append(shapes)
        return StepTimes(dict(self.seconds), "stub sizes")


@pytest.fixture
def cache_file(tmp_path, monkeypatch):
    path = tmp_path / "precision.json"
    monkeypatch.setenv(precision_choice.CACHE_ENV, str(path))
    return path


def _linear_outputs(model) -> tuple[list[tuple[torch.dtype, bool]], list]:
    """(dtype, under autograd) of every Linear output from now on (forward hooks), and the hooks to remove."""
    seen = []
    hooks = [
        m.register_forward_hook(lambda mod, args, out: seen.append((out.dtype, torch.is_grad_enabled())))
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    return seen, hooks


@pytest.mark.parametrize("fp32, bf16, expected", [(1.0, 0.5, torch.bfloat16), (0.5, 1.0, torch.float32)])
def test_auto_runs_generation_and_update_in_the_faster_precision(make_trainer, cache_file, monkeypatch, fp32, bf16, expected):
    import rlvr.rollout.engines.hf.lean_decode as lean_decode
    from rlvr.rollout.engines.hf.compiled_decode import Product

    timer = StubTimer(fp32, bf16)
    monkeypatch.setattr(precision_choice, "measure_step", timer)
    t = make_trainer("model.autocast=auto", "steps=1", "optim.skip_zero_advantage=false")  # the update runs every row
    resolved = "bf16" if expected == torch.bfloat16 else "none"
    assert len(timer.calls) == 1
    assert t.precision.autocast == t.updater.precision == t.source.autocast == resolved
    seen, hooks = _linear_outputs(t.model)
    direct = lean_decode._product  # the lean step's products (fused ones too) run from their weights, no module call: seen here

    def recording(p, x, casts=None):
        out = direct(p, x, casts)
        if isinstance(p, Product):
            seen.append((out.dtype, torch.is_grad_enabled()))
        return out

    monkeypatch.setattr(lean_decode, "_product", recording)
    t.train_step()
    for h in hooks:
        h.remove()
    # generation (no autograd: a prefill and decode steps) and the update's forward (autograd): every matmul in the chosen precision
    assert set(seen) == {(expected, False), (expected, True)}
    assert sum(not grad for _, grad in seen) >= 3 * len(hooks)


def test_the_choice_is_printed_and_recorded_and_a_second_run_reads_the_cache(make_trainer, cache_file, monkeypatch, capsys):
    timer = StubTimer(0.75, 2.5)
    monkeypatch.setattr(precision_choice, "measure_step", timer)
    first = make_trainer("model.autocast=auto", "steps=1", run="a")
    summary = first.train()
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("precision:"))
    assert line == f"precision: fp32 (step estimate fp32 0.75 s, bf16 2.50 s; measured at stub sizes; cached in {cache_file})"
    assert summary["precision"] == {
        "name": "fp32",
        "autocast": "none",
        "reason": line[len("precision: fp32 (") : -1],
        "step_seconds": {"none": 0.75, "bf16": 2.5},
    }
    assert json.loads((first.output_dir / "summary.json").read_text())["precision"] == summary["precision"]

    second = make_trainer("model.autocast=auto", "steps=1", run="b")
    assert len(timer.calls) == 1  # the second run timed nothing
    assert second.precision.autocast == "none" and second.precision.step_seconds == {"none": 0.75, "bf16": 2.5}
    assert "timed earlier" in second.precision.describe()
    assert len(json.loads(cache_file.read_text())) == 1


@pytest.mark.parametrize(
    "overrides, expected",
    [(["model.autocast=bf16"], "bf16"), (["model.autocast=none"], "none"), (["model.autocast=auto", "model.dtype=bfloat16"], "none")],
)
def test_forced_precision_and_low_precision_weights_are_never_timed(make_trainer, cache_file, monkeypatch, overrides, expected):
    timer = StubTimer(1.0, 0.5)
    monkeypatch.setattr(precision_choice, "measure_step", timer)
    t = make_trainer(*overrides)
    assert t.precision.autocast == t.updater.precision == expected
    assert t.precision.name == {"bf16": "bf16", "none": "bfloat16" if "model.dtype=bfloat16" in overrides else "fp32"}[expected]
    assert timer.calls == [] and not cache_file.exists()


@pytest.mark.parametrize("supported, expected", [(True, "bf16"), (False, "none")])
def test_auto_on_cuda_follows_bf16_support_untimed(tiny_model_dir, cache_file, monkeypatch, supported, expected):
    from transformers import AutoModelForCausalLM

    timer = StubTimer(0.5, 1.0)
    monkeypatch.setattr(precision_choice, "measure_step", timer)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)  # stays on the CPU: nothing runs
    assert choose_precision("auto", model, torch.device("cuda"), SHAPES).autocast == expected
    assert timer.calls == []


def test_the_cache_key_tells_models_and_shapes_apart(make_trainer, tiny_model_dir, cache_file, monkeypatch):
    from transformers import AutoModelForCausalLM

    cpu = torch.device("cpu")
    small, bundled = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny"))
    again = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert cache_key(small, cpu, SHAPES) == cache_key(again, cpu, SHAPES)
    assert cache_key(small, cpu, SHAPES) != cache_key(bundled, cpu, SHAPES)
    assert cache_key(small, cpu, SHAPES) != cache_key(small, cpu, StepShapes(8, 16, 12, 8, 16))
    # through the trainer: another model is timed again, and keeps its own answer
    timer = StubTimer(1.0, 0.5)
    monkeypatch.setattr(precision_choice, "measure_step", timer)
    assert make_trainer("model.autocast=auto", run="a").precision.autocast == "bf16"
    timer.seconds = {"none": 0.5, "bf16": 1.0}
    assert make_trainer("model.autocast=auto", "model.path=tiny", run="b").precision.autocast == "none"
    assert make_trainer("model.autocast=auto", run="c").precision.autocast == "bf16"  # cached: the first model's answer
    assert len(timer.calls) == 2


CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: {model}
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 2
flags\t\t: fpu sse2 avx2 avx512f {extra}

processor\t: 1
model name\t: another block, not read
"""


def test_cpus_of_one_name_with_other_features_are_other_machines(make_trainer, cache_file, monkeypatch):
    """A cloud CPU's generic name ("Intel(R) Xeon(R) Processor") stands for several generations, and VMs differ in the
    features they pass through: the caches' keys (machine_cache.cpu_identity) tell them apart by the family/model/
    stepping numbers and the flags, so a choice timed on a CPU with fast bf16 is not read back on one without, while
    the same CPU (flags in another order) reads its own answer back. So do the other caches (measured_once)."""
    from rlvr.models import machine_cache

    def on(model: int, extra: str) -> None:
        monkeypatch.setattr(machine_cache, "_cpuinfo", lambda: CPUINFO.format(model=model, extra=extra))

    on(143, "avx512_bf16 amx_bf16")
    bf16_cpu = machine_cache.cpu_identity()
    assert bf16_cpu.startswith("Intel(R) Xeon(R) Processor, 6-143-2, flags ")
    on(143, "amx_bf16 avx512_bf16")  # the same features
    assert machine_cache.cpu_identity() == bf16_cpu
    on(143, "")
    assert machine_cache.cpu_identity() != bf16_cpu
    on(207, "avx512_bf16 amx_bf16")
    assert machine_cache.cpu_identity() != bf16_cpu
    monkeypatch.setattr(machine_cache, "_cpuinfo", lambda: "")
    assert machine_cache.cpu_identity() == (machine_cache.platform.processor() or "unknown")

    timer = StubTimer(1.0, 0.5)
    monkeypatch.setattr(precision_choice, "measure_step", timer)
    on(143, "avx512_bf16 amx_bf16")
    assert make_trainer("model.autocast=auto", run="a").precision.autocast == "bf16"
    timer.seconds = {"none": 0.5, "bf16": 3.0}  # bf16 emulated
    on(143, "")
    assert make_trainer("model.autocast=auto", run="b").precision.autocast == "none"  # timed again, not read back
    on(143, "amx_bf16 avx512_bf16")
    assert make_trainer("model.autocast=auto", run="c").precision.autocast == "bf16"  # its own answer
    assert len(timer.calls) == 2

    measured = []
    ask = lambda: machine_cache.measured_once("probe", {"n": 1}, lambda: measured.append(1) or {"v": len(measured)})  # noqa: E731
    assert ask() == {"v": 1} and ask() == {"v": 1}
    on(143, "")
    assert ask() == {"v": 2}


def test_measuring_on_a_cold_cache_leaves_the_runs_random_numbers_as_they_were(tmp_path, monkeypatch):
    """The machine's probes (fp32 packing, the decode attention's way) time random data: on a machine measuring for
    the first time they draw it, yet the run's own draws after them are those of a run that read the answers back
    (Clip-Cov's tokens once differed between the two)."""
    from rlvr.models import packed_linears
    from rlvr.rollout.engines.hf import decode_attention

    monkeypatch.setenv("RLVR_PRECISION_CACHE", str(tmp_path / "precision.json"))
    monkeypatch.setattr(packed_linears, "_FP32_CHOICES", {})
    monkeypatch.setattr(decode_attention, "_CHOICES", {})
    torch.manual_seed(3)
    expected = torch.rand(5)
    for _ in ("cold", "warm"):
        torch.manual_seed(3)
        packed_linears.fp32_way(64, 96, 8)
        decode_attention.decode_attention_way(2, 4, 4, 2, 8, 12, 16, torch.float32, shared=None)
        assert torch.equal(torch.rand(5), expected)
        # measured (cold), then read (a folder "native" holds the kernels when this process first built them here)
        assert {p.name for p in tmp_path.iterdir() if p.is_file()} == {"packing.json", "decode_attention.json"}
        monkeypatch.setattr(packed_linears, "_FP32_CHOICES", {})  # a new process on this machine
        monkeypatch.setattr(decode_attention, "_CHOICES", {})


@pytest.mark.parametrize("bail_ratio", [0.0, math.inf])
def test_real_timing_of_the_tiny_model_leaves_the_run_as_it_was(tiny_model_dir, monkeypatch, bail_ratio):
    """Both estimates come out positive; with bf16 judged too slow on the matmul probe (ratio 0) it
    is estimated from the probe, else timed on the model. Weights, gradients, mode, the random
    stream and torch's thread count are as before."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(precision_timing, "BAIL_RATIO", bail_ratio)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).train()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    torch.set_num_threads(2)  # timed on one, restored after
    try:
        times = measure_step(model, SHAPES)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert set(times.seconds) == {"none", "bf16"} and all(0 < s < 60 for s in times.seconds.values())
    assert ("not timed on the model" in times.note) == (bail_ratio == 0.0)
    assert re.fullmatch(r"1 thread, [1-8] rows x 16 tokens, decode \d+ rows", times.measured_at), times.measured_at
    assert torch.equal(torch.get_rng_state(), rng) and model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_an_unresolved_precision_never_reaches_a_forward():
    with pytest.raises(ValueError, match="resolved precision"):
        autocast_context("auto", torch.device("cpu"))
