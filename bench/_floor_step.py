"""A bench/floor.py config's Trainer after its first steps, with that step's parts to run again: the generation (the
same prompts, sampling and seeds) and the forward+backward of its first micro-batch (no optimizer step). The A/B and
per-op benches time these parts alone (microbatch_ab, op_times, norm_rotary_ab, prefix_attention_ab, generation_ab)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
import types
from collections.abc import Callable
from typing import NamedTuple

import torch


class FloorStep(NamedTuple):
    trainer: object  # rlvr.training.Trainer
    generate: Callable[[], object]  # the last step's generation again (a multi-turn source's whole rollout: its Episodes)


class MicroBatch(NamedTuple):
    run: Callable[[], None]  # Updater.micro_batch_step of the last step's first micro-batch
    inputs: object  # its MinibatchInputs
    rows: slice  # the micro-batch's rows in inputs.episodes


def floor_step(name: str, *, extra: list[str] | tuple[str, ...] = (), steps: int = 1) -> FloorStep:
    """Config `name` (plus rlvr overrides `extra`) built as bench/floor.py builds it, 2 threads, `steps` training steps
    run; its run folder is removed when the process exits."""
    import compare_trl
    import floor
    from rlvr.config import load_config
    from rlvr.models.precision import autocast_context
    from rlvr.training import Trainer

    torch.set_num_threads(2)
    spec = floor.make_spec(name, floor.build_inputs([name]), types.SimpleNamespace(threads=2, warmup=1, steps=steps))
    spec["out"] = tempfile.mkdtemp(prefix="rlvr_bench_")
    atexit.register(shutil.rmtree, spec["out"], ignore_errors=True)
    spec["extra"] = spec["extra"] + list(extra)
    trainer = Trainer(load_config(None, compare_trl.rlvr_overrides(spec)), logger_live=False)
    generate, rollout, call = trainer.engine.generate, trainer.source.rollout, {}

    def recording(prompts, params, seeds):
        call.update(prompts=list(prompts), params=params, seeds=list(seeds))
        return generate(prompts, params, seeds)

    def recording_rollout(rows, seeds):  # multi-turn sources call the engine's generate_episodes, with a driver of theirs
        call.update(rows=list(rows), row_seeds=list(seeds))
        return rollout(rows, seeds)

    trainer.engine.generate, trainer.source.rollout = recording, recording_rollout
    for _ in range(steps):
        trainer.train_step()

    def again():  # under the run's autocast, as the rollout source calls the engine (rlvr.rollout.sources)
        if "prompts" not in call:  # no single-turn generate: the source's whole rollout again (episodes, their tools)
            return rollout(call["rows"], call["row_seeds"])
        with autocast_context(trainer.precision.autocast, trainer.device, getattr(trainer.engine, "model", None)):
            return generate(call["prompts"], call["params"], call["seeds"])

    return FloorStep(trainer, again)


def first_micro_batch(trainer) -> MicroBatch | None:
    """The last step's first micro-batch, to run again; None when the step trained no rows."""
    from rlvr.training.minibatches import this_ranks_minibatches
    from rlvr.training.update_inputs import FirstEpoch
    from rlvr.training.update_metrics import MetricSums

    rec, up = trainer.last_step, trainer.updater
    minibatches = this_ranks_minibatches(rec.batch, rec.advantages, trainer.cfg.optim.steps_per_generation, trainer.dist)
    inputs = up.prepare(minibatches[0]) if minibatches else None
    if inputs is None or not inputs.micro_batches:
        return None
    mb = inputs.micro_batches[0]
    return MicroBatch(lambda: up.micro_batch_step(inputs, mb, FirstEpoch(), MetricSums(trainer.device), last=True), inputs, mb.rows)


def micro_batch_ab(
    name: str, ways: dict[str, Callable[[], None]], reps: int
) -> tuple[object, MicroBatch, dict[str, list[float]], dict[str, list]]:
    """(the trainer, its micro-batch, seconds per way, each way's last gradients): config `name` after two training
    steps, its first micro-batch's forward and backward `reps` times per way after a round that warms every way,
    alternating the order; `ways` maps a name to what switches that way on. Each run starts from no gradients; the
    gradients are the trainable parameters' (None where a parameter got none)."""
    trainer = floor_step(name, steps=2).trainer
    mb = first_micro_batch(trainer)
    if mb is None:
        raise SystemExit(f"config {name}: its step trained no rows: no micro-batch to time")
    params = [p for p in trainer.train_model.parameters() if p.requires_grad]
    seconds: dict[str, list[float]] = {w: [] for w in ways}
    grads: dict[str, list] = {}
    for i in range(reps + 1):
        for way in list(ways) if i % 2 == 0 else list(ways)[::-1]:
            ways[way]()
            for p in params:
                p.grad = None
            t = time.perf_counter()
            mb.run()
            if i:
                seconds[way].append(time.perf_counter() - t)
            grads[way] = [None if p.grad is None else p.grad.clone() for p in params]
    return trainer, mb, seconds, grads


def same_gradients(a: list, b: list) -> bool:
    """Whether two micro_batch_ab gradient lists are the same, bit for bit."""
    return all((x is None and y is None) or (x is not None and y is not None and bool((x == y).all())) for x, y in zip(a, b))


def relative_gap(a: list, b: list) -> float:
    """The largest gap between two micro_batch_ab gradient lists, each tensor's relative to its largest entry in `a`."""
    return max(float((x - y).abs().max() / x.abs().max().clamp_min(1e-30)) for x, y in zip(a, b) if x is not None and y is not None)
