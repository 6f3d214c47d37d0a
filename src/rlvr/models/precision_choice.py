"""`model.autocast` resolved, once per run: `bf16` (bf16 autocast) or `none` (the weights' dtype).

`auto` times the model on the CPU (rlvr.models.precision_timing) and remembers the answer in a
small JSON file, keyed by the model, the machine and the step's shapes, so later runs do not
time again: precision_cache_path(), overridable with RLVR_PRECISION_CACHE.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

import torch

from rlvr.models.machine_cache import CACHE_ENV, cpu_identity, cpu_model, precision_cache_path, read_cache, write_cache
from rlvr.models.precision_timing import StepShapes, measure_step

__all__ = ["CACHE_ENV", "PrecisionChoice", "choose_precision", "cpu_model", "precision_cache_path", "read_cache", "write_cache"]

TIMING = 2  # how precision_timing times a step; estimates cached under another are not reused (2: decode from packed weights)


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision every forward of the run uses, and why."""

    autocast: str  # "bf16" or "none": what rlvr.models.precision.autocast_context runs under
    reason: str  # the console line's explanation
    weights: str = "fp32"  # the weights' dtype: what `none` runs in
    step_seconds: dict[str, float] = field(default_factory=dict)  # auto, timed: estimated seconds per step by precision

    @property
    def name(self) -> str:
        return "bf16" if self.autocast == "bf16" else self.weights

    def describe(self) -> str:
        return f"precision: {self.name} ({self.reason})"

    def summary(self) -> dict:
        """What summary.json records."""
        timed = {"step_seconds": self.step_seconds} if self.step_seconds else {}
        return {"name": self.name, "autocast": self.autocast, "reason": self.reason, **timed}


def choose_precision(setting: str, model, device: torch.device, shapes: StepShapes) -> PrecisionChoice:
    """`bf16` / `none` as set, nothing timed. `auto`: on CUDA bf16 where the GPU supports it
    (torch.cuda.is_bf16_supported(); there it is the faster, so nothing is timed), else none;
    weights not in float32 run in their own dtype (none); on the CPU the faster of fp32 and bf16
    autocast for one training step of this model at these shapes, timed (a few seconds for a
    ~100M model) unless the cache already holds the answer for this model, machine and shapes."""
    dtype = next(model.parameters()).dtype
    weights = "fp32" if dtype == torch.float32 else str(dtype).removeprefix("torch.")
    if setting != "auto":
        return PrecisionChoice(setting, f"model.autocast={setting}", weights)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice("bf16", "model.autocast=auto: this GPU supports bf16", weights)
        return PrecisionChoice("none", "model.autocast=auto: this GPU has no bf16", weights)
    if dtype != torch.float32:
        return PrecisionChoice("none", f"model.autocast=auto: the weights are {weights}, run as they are", weights)
    path, key = precision_cache_path(), cache_key(model, device, shapes)
    cache = read_cache(path)
    if _is_entry(cache.get(key)):
        entry, how = cache[key], f"timed earlier, cached in {path}"
    else:
        times = measure_step(model, shapes)
        entry = {
            "autocast": min(times.seconds, key=times.seconds.__getitem__),
            "step_seconds": times.seconds,
            "measured_at": times.measured_at,
            "note": times.note,
        }
        write_cache(path, {**cache, key: entry})
        how = f"cached in {path}"
    s = entry["step_seconds"]
    details = "; ".join(filter(None, [f"measured at {entry['measured_at']}", entry["note"], how]))
    return PrecisionChoice(entry["autocast"], f"step estimate fp32 {s['none']:.2f} s, bf16 {s['bf16']:.2f} s; {details}", weights, s)


def cache_key(model, device: torch.device, shapes: StepShapes) -> str:
    """The model (architecture, dtype, what trains, checkpointing), the machine (CPU, torch,
    threads, device) and the shapes, as one JSON string."""
    config = model.config.to_dict()
    config.pop("_name_or_path", None)  # the same model from another folder times the same
    key = {
        "model": hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16],
        "dtype": str(next(model.parameters()).dtype),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "checkpointing": _checkpointing(model),
        "cpu": cpu_identity(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "shapes": asdict(shapes),
        "timing": TIMING,
    }
    return json.dumps(key, sort_keys=True)


def _checkpointing(model) -> bool:
    """Whether the model recomputes activations in the backward (the name in transformers >= 5.2x, or the older one)."""
    return bool(
        getattr(
            model, "is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing") else "is_gradient_checkpointing", False
        )
    )


def _is_entry(entry) -> bool:
    return (
        isinstance(entry, dict)
        and entry.get("autocast") in ("bf16", "none")
        and isinstance(entry.get("step_seconds"), dict)
        and {"none", "bf16"} <= set(entry["step_seconds"])
    )
