"""A run's folder: what it holds, how far the run got, and the only ways its files change.

Nothing a run wrote is cut or overwritten silently. The rules, in the order `check_resume` applies them:

- a finished run resumed with the same `steps` is left exactly as it is (`RunFinished`);
- resuming never undoes steps: `steps` below what the run has done is refused;
- a finished run continues from its end (the end of every run is a checkpoint), appending steps;
- a finished run whose newest checkpoint is older than its end (written before end checkpoints
  existed) would recompute its last steps and replace `final/`: refused without `--force`, and with
  it the replaced files are kept in a sibling folder;
- a run that died (kill -9, power loss) recomputes the steps logged after its newest checkpoint;
  the logs they replace are copied to a sibling folder first.

Every write that replaces a file is atomic (temporary name, fsync, rename), so a kill at any moment
leaves either the old file or the new one; `final/` is swapped in the same way (`replace_final`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rlvr.config import ConfigError
from rlvr.dist import full_model_state
from rlvr.observe.run_files import read_jsonl
from rlvr.training.checkpoint import complete_checkpoints, latest_checkpoint, remove_partial_checkpoints

# What a run folder may hold; a fresh start in a used folder (--force) moves all of it aside.
RUN_FILES = (
    "metrics.jsonl",
    "samples.jsonl",
    "samples.parquet",
    "summary.json",
    "config.yaml",
    "checkpoints",
    "tb",
    "final",
    "final-merged",
    "report",
    "wandb",
)
LOGS = ("metrics.jsonl", "samples.jsonl", "samples.parquet", "summary.json", "config.yaml")  # copied aside before a cut
FINAL_DIRS = ("final", "final-merged")


class RunFinished(Exception):
    """Resuming a run that already finished at the requested `steps`: nothing to do, nothing changed."""


# ---------------------------------------------------------------------------- reading the folder


@dataclass(frozen=True)
class RunProgress:
    """How far the run in a folder got, from its files alone."""

    checkpoint_step: int  # the newest complete checkpoint's step (0: none)
    logged_step: int  # the last step in metrics.jsonl (0: none)
    finished_step: int | None  # the step it finished at (summary.json and final/ written), None while unfinished

    @property
    def done(self) -> int:
        return max(self.checkpoint_step, self.logged_step, self.finished_step or 0)


def read_progress(output_dir: Path) -> RunProgress:
    ckpt = latest_checkpoint(output_dir / "checkpoints")
    logged = [r.get("step", 0) for r in read_jsonl(output_dir / "metrics.jsonl")]
    return RunProgress(
        checkpoint_step=int(ckpt.name.split("-")[1]) if ckpt else 0,
        logged_step=max(logged, default=0),
        finished_step=_finished_step(output_dir, max(logged, default=0)),
    )


def _finished_step(output_dir: Path, logged_step: int) -> int | None:
    summary = output_dir / "summary.json"
    if not (summary.is_file() and (output_dir / "final").is_dir()):
        return None
    try:
        steps = json.loads(summary.read_text()).get("steps")
    except (json.JSONDecodeError, OSError):
        return None
    return int(steps) if steps is not None else logged_step  # summaries written before they said their steps


def holds_a_run(output_dir: Path) -> bool:
    """Whether the folder holds (part of) a run: logged steps, a checkpoint or a final model."""
    metrics = output_dir / "metrics.jsonl"
    return (
        (metrics.is_file() and metrics.stat().st_size > 0)
        or latest_checkpoint(output_dir / "checkpoints") is not None
        or (output_dir / "final").exists()
    )


# ---------------------------------------------------------------------------- deciding a resume


@dataclass(frozen=True)
class ResumePlan:
    """What resuming will do to the folder before training: which steps are recomputed, and whether the
    finished run's final model and summary are replaced (only with --force)."""

    progress: RunProgress
    from_step: int  # the checkpoint resumed from (0: none, a fresh start)
    recompute: tuple[int, int] | None  # (first, last) logged steps after that checkpoint, done again
    replaces_final: bool  # the finished run's final/ and summary.json are moved aside (--force)
    newer_checkpoints: bool  # checkpoints after the one resumed from are moved aside (--force)

    def describe(self, kept: Path) -> str:
        parts = []
        if self.recompute:
            parts.append(
                f"steps {self.recompute[0]}-{self.recompute[1]} were logged after checkpoint step {self.from_step} and are done again"
            )
        if self.replaces_final:
            parts.append(f"the finished run's final/ and summary.json (step {self.progress.finished_step}) are replaced")
        if self.newer_checkpoints:
            parts.append(f"checkpoints after step {self.from_step} are set aside")
        return "resume: " + "; ".join(parts) + f"; the files as they were are kept in {kept}"


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint folder (`step-0000012`, or the step its COMPLETE marker names)."""
    name = path.name
    if name.startswith("step-") and name[5:].isdigit():
        return int(name[5:])
    return int((path / "COMPLETE").read_text().strip())


def check_resume(output_dir: Path, steps: int, *, force: bool, checkpoint: Path | None = None) -> ResumePlan:
    """Refuse (ConfigError) or stop (RunFinished) a resume that would lose or redo finished work; else the plan.
    `checkpoint`: an explicit checkpoint to resume from (default: the folder's newest)."""
    p = read_progress(output_dir)
    run = output_dir
    own = checkpoint is not None and checkpoint.resolve().parent == (output_dir / "checkpoints").resolve()
    from_step = checkpoint_step(checkpoint) if own and checkpoint is not None else p.checkpoint_step
    if checkpoint is not None and not own:  # another run's checkpoint: a warm start into this folder
        if holds_a_run(output_dir):
            raise ConfigError(
                f"resume={checkpoint} is another run's checkpoint but output_dir {run} already holds a run: choose an empty output_dir"
            )
        return ResumePlan(p, checkpoint_step(checkpoint), None, False, False)
    if steps < p.done:
        raise ConfigError(
            f"steps={steps}: the run in {run} has done {p.done} steps, and resuming never undoes steps; "
            f"give steps > {p.done} to train it further, or start a new run (another output_dir) for a shorter one"
        )
    if p.finished_step is not None and steps == p.finished_step == p.done:
        raise RunFinished(
            f"{run} finished at step {p.finished_step}: nothing to do, nothing changed "
            f"(give steps=N with N > {p.finished_step} to train it further)"
        )
    recompute = (from_step + 1, p.logged_step) if p.logged_step > from_step else None
    replaces_final = p.finished_step is not None and from_step < p.finished_step
    newer_checkpoints = from_step < p.checkpoint_step
    if replaces_final and not force and not newer_checkpoints:
        first, last = recompute or (from_step + 1, p.finished_step)
        raise ConfigError(
            f"{run} finished at step {p.finished_step} but its newest checkpoint is step {from_step} "
            f"(written before rlvr saved the end of every run): continuing would recompute steps {first}-{last} "
            "and replace final/. Pass --force to do so (the replaced files are kept in a sibling folder), "
            "or start a new run"
        )
    if newer_checkpoints and not force:
        raise ConfigError(
            f"resume={checkpoint}: the run in {run} has a newer checkpoint (step {p.checkpoint_step}); resuming "
            f"from step {from_step} would recompute steps {from_step + 1}-{p.done}. Pass --force to do so (what it "
            "replaces is kept in a sibling folder), or resume=auto to continue from the newest"
        )
    return ResumePlan(p, from_step, recompute, replaces_final, newer_checkpoints)


def keep_before_resume(output_dir: Path, plan: ResumePlan) -> Path | None:
    """Before a resume that cuts logs or replaces final/: copy the logs (and TensorBoard's events) to a
    sibling folder and move the finished run's final model and summary there; returns that folder.
    Copies are complete before anything in the run changes; the moves are renames."""
    if plan.recompute is None and not plan.replaces_final and not plan.newer_checkpoints:
        return None
    forced = plan.replaces_final or plan.newer_checkpoints
    target = _sibling(output_dir, "replaced" if forced else "rewound")
    for name in LOGS:
        if (output_dir / name).is_file():
            shutil.copy2(output_dir / name, target / name)
    if (output_dir / "tb").is_dir():
        shutil.copytree(output_dir / "tb", target / "tb")
    fsync_tree(target)
    if plan.replaces_final:
        for name in (*FINAL_DIRS, "summary.json"):  # the run is no longer finished: the next end writes them anew
            if (output_dir / name).exists():
                os.replace(output_dir / name, target / name)
    if plan.newer_checkpoints:
        (target / "checkpoints").mkdir()
        for ckpt in complete_checkpoints(output_dir / "checkpoints"):
            if checkpoint_step(ckpt) > plan.from_step:
                os.replace(ckpt, target / "checkpoints" / ckpt.name)
    fsync_dir(output_dir)
    return target


# ---------------------------------------------------------------------------- changing files safely


def set_aside(output_dir: Path) -> Path:
    """Move every file of the run in `output_dir` to a new sibling folder `<name>.replaced-<time>`
    (outside the folder, so neither resume=auto nor TensorBoard finds it there); returns that folder.
    A folder holding only the run is renamed whole (one atomic step); otherwise the run's files are
    moved one by one, the checkpoints and config last, so a kill part-way leaves the run resumable
    where its checkpoints are."""
    if output_dir.resolve() != Path.cwd().resolve() and all(_run_file(p.name) for p in output_dir.iterdir()):
        target = _sibling(output_dir, "replaced", create=False)
        os.replace(output_dir, target)
        output_dir.mkdir()
        fsync_dir(output_dir.parent)
        return target
    target = _sibling(output_dir, "replaced")
    for name in sorted(RUN_FILES, key=lambda n: n in ("checkpoints", "config.yaml")):
        if (output_dir / name).exists():
            os.replace(output_dir / name, target / name)
    return target


def _run_file(name: str) -> bool:
    return name in RUN_FILES or (name.startswith(".") and name.endswith((".tmp", ".new", ".old")))  # ours, half-written


def _sibling(output_dir: Path, what: str, *, create: bool = True) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = output_dir.with_name(f"{output_dir.name}.{what}-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = output_dir.with_name(f"{output_dir.name}.{what}-{stamp}-{n}")
    if create:
        target.mkdir(parents=True)
    return target


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep only the complete lines of steps <= last_step (written atomically)."""
    if path.exists():
        write_atomically(path, "".join(json.dumps(r) + "\n" for r in read_jsonl(path) if r.get("step", 0) <= last_step))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with p.open("rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(path)


def replace_final(output_dir: Path, name: str, write) -> None:
    """Write `output_dir/name` (a model folder) through `write(folder)` so that a kill at any moment
    leaves the old folder or the new one, never a mix: written as `.name.tmp`, renamed `.name.new`
    once complete, then swapped in. `recover_final` finishes or undoes a swap a kill interrupted."""
    tmp, new, old, final = (output_dir / f".{name}.tmp", output_dir / f".{name}.new", output_dir / f".{name}.old", output_dir / name)
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    fsync_tree(tmp)
    os.replace(tmp, new)
    if final.exists():
        os.replace(final, old)
    os.replace(new, final)
    fsync_dir(output_dir)
    shutil.rmtree(old, ignore_errors=True)


def recover_final(output_dir: Path) -> None:
    """Undo what a kill left of `replace_final`: a half-written folder is deleted, a complete one that was
    not yet swapped in is dropped (the run's end is redone from its checkpoint), the old one put back."""
    for name in FINAL_DIRS:
        tmp, new, old, final = (output_dir / f".{name}.tmp", output_dir / f".{name}.new", output_dir / f".{name}.old", output_dir / name)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(new, ignore_errors=True)
        if old.exists() and not final.exists():
            os.replace(old, final)
        shutil.rmtree(old, ignore_errors=True)


def save_final(output_dir: Path, policy, tokenizer, dist, *, merged: bool) -> None:
    """The trained model in final/ (and, with `merged`, LoRA merged into the weights in final-merged/), with its tokenizer,
    each swapped in whole. Every rank calls it: under FSDP2 they gather the whole weights on rank 0, named as
    `policy.save` writes them (the peft wrapper with LoRA); rank 0 writes."""
    full = full_model_state(dist, policy.peft or policy.model)
    if not dist.is_main:
        return

    def final(folder: Path) -> None:
        policy.save(folder, full)
        tokenizer.save_pretrained(folder)

    def final_merged(folder: Path) -> None:
        policy.save_merged(folder)
        tokenizer.save_pretrained(folder)

    replace_final(output_dir, "final", final)  # whole or not at all: a kill mid-write leaves the previous final/
    if merged:
        replace_final(output_dir, "final-merged", final_merged)


def open_output_dir(cfg, dist, *, force: bool) -> tuple[Path, ResumePlan | None]:
    """The run's folder, before anything is loaded: refused when it holds a run that is neither resumed nor forced,
    cleared of what a kill left half-written, and, on a resume, the plan of what resuming keeps (refused when it
    would undo, redo or replace finished work; RunFinished when a finished run is resumed at its steps)."""
    output_dir = Path(cfg.output_dir or time.strftime("runs/%Y%m%d-%H%M%S"))
    if not cfg.resume and not force and holds_a_run(output_dir):
        raise ConfigError(
            f"output_dir {output_dir} already holds a run: continue it with "
            f"`rlvr train --resume {output_dir}`, choose another output_dir, or pass --force to start over "
            "(the old run is moved aside)"
        )
    if dist.is_main and output_dir.is_dir():  # what a kill left half-written goes before the folder is read
        remove_partial_checkpoints(output_dir / "checkpoints")
        recover_final(output_dir)
    dist.barrier("output folder")
    if not cfg.resume:
        return output_dir, None
    explicit = None if cfg.resume == "auto" else Path(cfg.resume)  # a checkpoint folder, or the newest in output_dir
    return output_dir, check_resume(output_dir, cfg.steps, force=force, checkpoint=explicit)
