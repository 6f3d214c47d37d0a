"""The GRPO loop, top to bottom. A step runs in four numbered phases (`train_step`, then `_one_step`):

    # 1 rollout and score      Collector.collect: prompts -> episodes from the rollout source -> rewards
    # 2 advantages             group-relative, on the whole batch
    # 3 update                 Updater.update: mu epochs over the minibatches, one optimizer step each
    # 4 metrics, doctor, checkpoint

Departures from the seeds' GRPO, all settable: the loss is aggregated with DAPO's token mean
over the whole batch (`algo.loss_type=dapo`; the seeds' per-sequence mean is `grpo`), and the
KL penalty is off (`algo.beta=0`), in which case no reference model is loaded.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from rlvr import algo
from rlvr.config import Config, ConfigError, batch_split_errors, to_dict
from rlvr.data.checks import check_reward_columns
from rlvr.dist import Dist, full_weights_for_generation, wrap
from rlvr.models.loading import load_tokenizer, with_template_kwargs
from rlvr.models.policy import load_policy
from rlvr.observe.console import NullLogger, RunLogger
from rlvr.rewards import RewardRunner
from rlvr.rollout import SamplingParams, make_engine
from rlvr.rollout.engines.remote.pool import NoServersLeft
from rlvr.rollout.sources import make_source
from rlvr.training import best
from rlvr.training.batch_plan import BatchPlan
from rlvr.training.checkpoint import checkpoint_path, latest_checkpoint, rng_state, set_rng_state
from rlvr.training.collect import Batch, Collector
from rlvr.training.evaluation import EvaluationError, HeldOut, held_out_for
from rlvr.training.hooks import NoHooks, RunHooks
from rlvr.training.minibatches import this_ranks_minibatches
from rlvr.training.reward_health import RewardHealth
from rlvr.training.run_control import AbandonStep, StopRequest, TrainingError, say_bad_step, seed_everything
from rlvr.training.run_folder import holds_a_run, open_output_dir, keep_before_resume, save_final, set_aside
from rlvr.training.run_folder import truncate_jsonl, write_atomically
from rlvr.training.setup import check_config, columns_the_rollout_adds, make_optimizer, prompt_tokens, run_device, run_precision
from rlvr.training.setup import held_out_sampling, plan_warnings, schedule_change, training_prompts, training_sampling
from rlvr.training.state import Checkpointer, TrainState
from rlvr.training.servers import GenerationApart, uses_servers
from rlvr.training.step_metrics import StepRecord, batch_metrics, log_completions, step_times
from rlvr.training.update import Updater
from rlvr.training.update_inputs import UpdateResult


class Trainer:
    eval_failures: str | None = None  # the last held-out evaluation's note on the rows its reward failed on, if any
    eval_metrics: dict | None = None  # the last held-out evaluation's eval/pass@k, eval/avg@n, eval/maj@n (eval.samples > 1)
    resumed_from: Path | None  # the checkpoint this run resumed from
    last_step: StepRecord | None  # the batch and advantages of the last step trained

    def __init__(self, cfg: Config, *, force: bool = False, logger_live: bool | None = None, source=None, hooks: RunHooks | None = None):
        """`source`: a RolloutSource to learn from instead of the single-turn one the config describes; `hooks`: told of each step."""
        self.cfg, self.logger_live, self.hooks = cfg, logger_live, hooks or NoHooks()
        self.warnings = check_config(cfg, force=force)
        self.device = run_device(cfg)
        self._join_processes()
        seed_everything(cfg.seed)
        # Everything a mistake in the output folder, data or rewards would stop, before the (slow) model load.
        self.output_dir, self.resume_plan = open_output_dir(cfg, self.dist, force=force)
        first_row = self._prompts_and_rewards(source)
        self._load_model(first_row)
        self.source = source or self._source()
        self.warnings += getattr(self.source, "notes", [])  # e.g. which format tools.format=auto chose, and why
        pad = self.tokenizer.pad_token_id
        self.collector = Collector(self.stream, self.source, self.rewards, cfg=cfg, dist=self.dist, model=self.model, pad_token_id=pad)
        if self.apart is not None:  # max_staleness > 0: the next steps' rollouts are made while this one trains
            self.source = self.collector.source = self.apart.ahead_of(self.source, self.stream, self.collector)
        self.optimizer, self.scheduler = make_optimizer(self.model, cfg)
        optim = {"optimizer": self.optimizer, "scheduler": self.scheduler, "dist": self.dist}
        self.updater = Updater(
            cfg, self.plan, policy=self.policy, train_model=self.train_model, device=self.device, precision=self.precision.autocast, **optim
        )
        self.checkpointer = Checkpointer(self.output_dir, cfg, policy=self.policy, stream=self.stream, tokenizer=self.tokenizer, **optim)
        self.state, self.resumed_from, self.last_step = TrainState(), None, None
        self.stop: StopRequest | None = None  # while train() runs: the signals' state, told which phase the loop is in
        self._prepare_output_dir(force)
        if self.apart is not None:
            self.apart.start(self.source, self.state.step, self.stream.position)

    def _join_processes(self) -> None:
        """This process's place in the job (torchrun's ranks, or one process), checked against the config."""
        cfg = self.cfg
        self.dist = Dist.from_env(backend=cfg.dist.backend, timeout=cfg.dist.timeout, device=self.device, strategy=cfg.dist.strategy)
        if self.dist.world_size != cfg.nproc and cfg.nproc > 1:
            raise ConfigError(
                f"`nproc`={cfg.nproc} but torchrun started {self.dist.world_size} processes: "
                f"set nproc={self.dist.world_size}, or launch with `rlvr train nproc=N`"
            )
        if split_errors := batch_split_errors(cfg, self.dist.world_size):
            raise ConfigError("invalid config:\n  - " + "\n  - ".join(split_errors))

    def _prompts_and_rewards(self, source) -> dict:
        """The reward runner, the prompt stream and the held-out set, each checked against the data; the first row."""
        cfg = self.cfg
        self.rewards = RewardRunner.from_config(cfg.rewards)
        self.reward_health = RewardHealth(self.rewards, self.dist, cfg.max_failed_reward_steps)
        self.rewards.state.is_world_process_zero, self.rewards.state.is_local_process_zero = self.dist.is_main, self.dist.local_rank == 0
        self.task, self.stream = training_prompts(cfg)
        first_row = self.stream.take(1)[0]
        check_reward_columns(self.rewards.fns, first_row, columns_the_rollout_adds(cfg, source))
        self.stream.position = 0
        self.held_out, self.eval_reward = self._held_out() if cfg.eval.before_after or cfg.eval.every else (None, None)
        return first_row

    def _held_out(self) -> tuple[HeldOut | None, RewardRunner | None]:
        held = held_out_for(self.cfg, self.task)
        return held, held.runner(columns_the_rollout_adds(self.cfg, None)) if held is not None else None

    def _load_model(self, first_row: dict) -> None:
        """Tokenizer, policy (and reference), the batch plan, the precision, the parallel wrapper and the engine."""
        cfg = self.cfg
        tokenizer, notes = load_tokenizer(cfg.model.tokenizer or cfg.model.path, cfg.model.trust_remote_code, cfg.model.gguf_file)
        self.tokenizer = with_template_kwargs(tokenizer, cfg.data.chat_template_kwargs)
        # beta = 0: no reference model exists at all (memory); the KL term is never computed.
        # LoRA: the reference is the same weights with the adapter disabled (no copy).
        self.policy = load_policy(cfg.model, self.device, beta=cfg.algo.beta)
        self.model, self.ref_model = self.policy.model, self.policy.ref_model
        tokens = prompt_tokens(first_row, self.tokenizer, cfg.data.system_prompt)
        self.plan = BatchPlan.build(cfg, self.dist.world_size, self.model, prompt_tokens=tokens)
        self.warnings += notes + plan_warnings(cfg, self.plan)
        # model.autocast resolved once (auto: timed, or read from the cache); every forward runs under .autocast
        self.precision = run_precision(cfg, self.plan, self.model, self.device, self.dist)
        self.train_model = wrap(self.dist, self.model)  # DDP / FSDP2, or the model itself
        self.apart = GenerationApart.start_servers(cfg, self) if uses_servers(cfg) else None  # rollout.servers, max_staleness > 0
        self.engine = (
            self.apart.engine if self.apart else make_engine(cfg.rollout.engine, self.model, self.tokenizer, cfg, self.policy.save)
        )

    def _source(self, sampling: SamplingParams | None = None):
        """The rollout source the config describes (single-turn, or multi-turn with tools), with this sampling
        (None: the training one, rollout.*)."""
        sampling = sampling or training_sampling(self.cfg)
        context = getattr(self.model.config, "max_position_embeddings", None)
        return make_source(
            self.cfg, self.engine, self.tokenizer, sampling, context_length=context, device=self.device, precision=self.precision.autocast
        )

    def _prepare_output_dir(self, force: bool) -> None:
        out = self.output_dir
        if not self.cfg.resume and self.dist.is_main and holds_a_run(out):  # --force (else refused above)
            # nothing of the old run may be resumed into, or plotted with, the new one
            self.warnings.append(f"--force: the run that was in {out} is now in {set_aside(out)}")
        if self.dist.is_main and self.resume_plan is not None and (kept := keep_before_resume(out, self.resume_plan)):
            self.warnings.append(self.resume_plan.describe(kept))
        self.dist.barrier("output folder")
        if self.cfg.resume and (resumed := self.checkpointer.resume(self.cfg.resume, force=force)):
            self.state, self.resumed_from = resumed
            if self.updater.entropy_control is not None and self.state.entropy_control is not None:
                self.updater.entropy_control.resume(self.state.entropy_control)
            self.source.sync_weights()
            self.warnings += schedule_change(self.cfg, self.resumed_from, self.state.step)

    # ------------------------------------------------------------------ one step

    def train_step(self) -> dict:
        """Phases 1 to 3 of one step; returns the metrics phase 4 logs (`_one_step`)."""
        t0 = time.perf_counter()
        # 1 rollout and score
        self._phase("generation", abandonable=True)  # nothing lasting changes until the update
        batch = self.collector.collect(self.state)
        if self.apart is not None:
            self.apart.after_collect(self.state.step + 1, self.stream.position)
        self._phase("update")
        t_collect = time.perf_counter() - t0
        # 2 advantages
        advantages, t1 = self.advantages(batch), time.perf_counter()
        # 3 update
        result = self.update(batch, advantages)
        t_train = time.perf_counter() - t1
        self.last_step = StepRecord(batch, advantages, result.micro_batch_sizes)
        return self.step_metrics(batch, advantages, result, t0=t0, t_collect=t_collect, t_train=t_train)

    def advantages(self, batch: Batch) -> torch.Tensor:
        """[N] group-relative advantages of the whole batch (every rank computes the same)."""
        a = self.cfg.algo
        how: dict[str, Any] = {"mode": a.reward_aggregation, "scale": a.scale_rewards, "ddof": a.std_ddof, "eps": a.std_eps}
        return algo.combine_rewards(batch.rewards, batch.reward_weights, batch.episodes.group_size, **how)

    def update(self, batch: Batch, advantages: torch.Tensor) -> UpdateResult:
        """mu epochs over this rank's share of each minibatch, the sampler given the new weights, the counters moved on."""
        result = self.updater.update(this_ranks_minibatches(batch, advantages, self.cfg.optim.steps_per_generation, self.dist))
        state = self.state
        state.step += 1
        self.source.sync_weights()  # a separate sampler (vLLM, servers) gets the new weights, version state.step; hf shares them
        state.skipped_steps += result.skipped
        state.entropy_control = None if (c := self.updater.entropy_control) is None else c.saved()  # checkpointed
        state.bad_steps_in_a_row = state.bad_steps_in_a_row + 1 if result.skipped else 0
        for e in (batch.episodes, batch.episodes.extra_sequences):  # the extra sequences are trained too
            state.num_tokens += 0 if e is None else int(e.prompt_mask.sum() + e.attention_mask.sum())
        return result

    def step_metrics(
        self, batch: Batch, advantages: torch.Tensor, result: UpdateResult, *, t0: float, t_collect: float, t_train: float
    ) -> dict:
        """The step's metrics (TRL's names): the update's, the batch's, the rollout source's, the reward functions' and the times."""
        state = self.state
        metrics = {**result.metrics, "skipped_steps": state.skipped_steps}
        metrics.update(batch_metrics(batch, advantages))
        metrics.update(self.source.metrics(batch.episodes))
        if self.apart is not None:  # weight syncs, each server's share, staleness
            metrics.update(self.apart.metrics(batch, self.collector.version))
        metrics.update({k: v for k, v in self.reward_health.step_metrics().items() if k not in metrics})  # errors, log_metric
        metrics.update(
            {"step": state.step, "num_tokens": state.num_tokens, **step_times(batch, t0=t0, t_collect=t_collect, t_train=t_train)}
        )
        if self.device.type == "cuda":
            metrics["memory/peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return metrics

    def evaluate(self) -> float | None:
        """The held-out score (greedy; accuracy for a 0/1 verifier), on rank 0 (None on the others, and
        without a held-out set). Every rank must call it: under FSDP2 they all take part in gathering
        the full weights, then wait while rank 0 generates."""
        if self.held_out is None and self.cfg.eval.data is not None:  # evaluation off in training: a script's call (TRL's API)
            self.held_out, self.eval_reward = self._held_out()
        if self.held_out is None:
            return None
        assert self.eval_reward is not None, "made with the held-out set"
        source = self._source(held_out_sampling(self.cfg, self.cfg.rollout.max_new_tokens))
        outcome, error = None, None
        with full_weights_for_generation(self.dist, self.model):
            if self.dist.is_main:
                try:
                    outcome = self.held_out.evaluate(source, self.eval_reward)
                except EvaluationError as e:  # a failure is never a score: stop rather than record 0
                    error = str(e)
        if self.dist.max(float(error is not None), what="held-out evaluation"):
            raise TrainingError(f"held-out evaluation of {self.held_out.name}: {error or 'failed on rank 0 (its log says why)'}")
        if outcome is None:
            return None
        self.eval_failures, self.eval_metrics = outcome.failure_note() if outcome.failed else None, outcome.metrics()
        return outcome.score

    def save_checkpoint(self) -> Path:
        path = self.checkpointer.save(self.state)
        self.hooks.saved(self, path)
        return path

    # ------------------------------------------------------------------ the loop

    def train(self) -> dict:
        cfg, out, main, state = self.cfg, self.output_dir, self.dist.is_main, self.state  # rank 0 writes logs, samples, checkpoints
        if main:
            out.mkdir(parents=True, exist_ok=True)
            write_atomically(out / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
            # Steps logged after the checkpoint resumed from are done again (their lines were kept aside first).
            truncate_jsonl(out / "metrics.jsonl", state.step)
            truncate_jsonl(out / "samples.jsonl", state.step)
        log = RunLogger(out, cfg.steps, state.step, live=self.logger_live, config=cfg) if main else NullLogger()
        for w in self.warnings:
            log.info(f"[note] {w}")
        log.info(self.plan.describe())
        log.info(self.precision.describe())
        summary: dict = {"output_dir": str(out), "precision": self.precision.summary()}
        self.stop = stop = StopRequest()
        self.hooks.train_begin(self)
        try:
            if cfg.eval.before_after and state.step == 0:
                self._phase("evaluation before training", abandonable=True)
                try:
                    state.eval_before = self._evaluate_and_say("before training", log)
                except AbandonStep:
                    return self._stopped(log, summary)
            while state.step < cfg.steps:
                if self._one_step(log) == "stop":
                    return self._stopped(log, summary)
            self._phase("end")
            self._finish(log, summary)
        finally:
            stop.restore()
            self.stop = None
            if self.apart is not None:
                self.apart.close()
            log.close()
        return summary

    def _one_step(self, log) -> str:
        """One step: phases 1 to 3 (`train_step`), then phase 4; "stop" when a stop signal (or an abandoned step) ends the run here."""
        started = time.time()
        self.hooks.step_begin(self)
        before = (self.stream.state_dict(), rng_state())  # where an abandoned step's generation started
        try:
            metrics = self.train_step()
        except (AbandonStep, NoServersLeft) as e:  # its generation changed nothing lasting but the prompt position and the RNG
            self.stream.load_state_dict(before[0])
            set_rng_state(before[1])
            if isinstance(e, NoServersLeft):  # the run ends, with a checkpoint of the last step done
                path, out, step = self.checkpointer.save_unless_saved(self.state), self.output_dir, self.state.step
                raise TrainingError(f"{e}; stopped after step {step}: checkpoint {path}. Resume with: rlvr train --resume {out}") from e
            return "stop"
        # 4 metrics, doctor, checkpoint
        started += self._evaluate_when_due(metrics, log)  # evaluating is not training
        self._phase("logging")
        log.log(metrics)  # metrics.jsonl, the dashboards, the console
        if self.hooks.step_end(self, metrics) and self.stop is not None:  # e.g. a callback's control.should_training_stop
            self.stop.requested = self.stop.requested or "a callback"
        for note in self.apart.notes() if self.apart else []:  # a generation server dropped, and why
            log.info(note)
        log.run_doctor_when_due(self.state.step)  # the doctor's rules over the run so far; new findings print as warnings
        assert self.stop is not None and self.last_step is not None, "train() runs this after a step"
        log_completions(log, self.cfg, metrics, self.last_step, stopping=self.stop.requested is not None)
        self.state.train_seconds += time.time() - started
        return self._checkpoint_when_due(log)

    def _evaluate_when_due(self, metrics: dict, log) -> float:
        """The held-out score every `eval.every` steps, as `eval/reward` in the step's metrics; returns the seconds it took."""
        cfg, step = self.cfg, self.state.step
        if not cfg.eval.every or step % cfg.eval.every or (step == cfg.steps and cfg.eval.before_after):
            return 0.0
        t_eval = time.time()
        self._phase("evaluation", abandonable=True)
        try:
            if (score := self._evaluate_and_say(f"at step {step}", log)) is not None:
                metrics.update({"eval/reward": score, **(self.eval_metrics or {})})
                best.improves(cfg, self.state, metrics)  # a new best: its step is checkpointed (_checkpoint_when_due)
        except AbandonStep:
            log.info(f"[stop] step {step}: evaluation abandoned; the step itself is kept")
        return time.time() - t_eval

    def _checkpoint_when_due(self, log) -> str:
        """After a logged step: stop on a failing reward or too many bad steps, stop on a signal (all ranks
        together), else checkpoint every `checkpoint.every` steps and at a new best evaluation. "stop" or "next"."""
        cfg, state = self.cfg, self.state
        assert self.stop is not None, "train() runs this"
        self.reward_health.check(self.output_dir / "checkpoints")  # a reward failing on every sample: stop, naming it
        if state.bad_steps_in_a_row:
            say_bad_step(self.state, self.cfg.max_bad_steps, self.output_dir / "checkpoints", log)
            return "next"  # never checkpoint right after a bad step
        if self.dist.max(float(self.stop.requested is not None), what="stop request"):  # all ranks stop together
            return "stop"
        due = cfg.checkpoint.every and state.step % cfg.checkpoint.every == 0 or state.best_step == state.step
        if due and state.step < cfg.steps and self.reward_health.may_checkpoint:
            self._phase("checkpoint")
            self.save_checkpoint()
        return "next"

    def _stopped(self, log, summary: dict) -> dict:
        """A stop signal ended the run after step `state.step`: checkpoint it (unless that checkpoint exists) and say how to go on."""
        self._phase("checkpoint")
        assert self.stop is not None, "train() runs this"
        out, step, path = self.output_dir, self.state.step, self.checkpointer.save_unless_saved(self.state)
        log.info(f"stopped by {self.stop.requested} at step {step}; checkpoint {path}. Resume with: rlvr train --resume {out}")
        summary["interrupted_at"] = step
        self.hooks.train_end(self, summary)
        return summary

    def _finish(self, log, summary: dict) -> None:
        """The end of the run, each part a resumable state: the end checkpoint (so `--resume ... steps=N` continues
        from here), final/ swapped in whole (the best checkpoint's weights with checkpoint.load_best_at_end), the held-out
        score, then summary.json, whose `steps` marks the run finished."""
        cfg, state, out = self.cfg, self.state, self.output_dir
        newest = latest_checkpoint(out / "checkpoints")
        if self.reward_health.may_checkpoint and newest != checkpoint_path(out / "checkpoints", state.step):
            self.save_checkpoint()
        summary["steps"] = state.step
        summary.update({"train_seconds": state.train_seconds, **best.summary(cfg, state)})  # over every segment of a resumed run
        if cfg.checkpoint.load_best_at_end and (best_path := self.checkpointer.best_checkpoint(state)) is not None:
            self.checkpointer.load_model_weights(best_path)  # final/ and the evaluation after training: the best step's model
        save_final(self.output_dir, self.policy, self.tokenizer, self.dist, merged=self.cfg.model.lora.save_merged)
        if cfg.eval.before_after and (after := self._evaluate_and_say("after training", log)) is not None:
            assert self.held_out is not None, "a score: there is a held-out set"
            summary.update(self.held_out.summary(state.eval_before, after))
            summary.update({k.replace("eval/", "eval_after_"): v for k, v in (self.eval_metrics or {}).items()})
        if self.dist.is_main:
            write_atomically(out / "summary.json", json.dumps(summary, indent=2))
        self.dist.barrier("end of training")
        self.hooks.train_end(self, summary)

    def _phase(self, phase: str, *, abandonable: bool = False) -> None:
        """Tell the stop handler where the loop is (a second signal abandons only generation or evaluation,
        and only in one process: several ranks must stop at the same point)."""
        if self.stop is not None:
            self.stop.at(self.state.step + 1, phase, abandonable=abandonable and self.dist.world_size == 1)

    def _evaluate_and_say(self, when: str, log) -> float | None:
        """Evaluate (every rank), and print rank 0's score."""
        score = self.evaluate()
        if score is not None:
            assert self.held_out is not None, "a score: there is a held-out set"
            sampled = "".join(f", {k.removeprefix('eval/')} {v:.3f}" for k, v in (self.eval_metrics or {}).items() if "std" not in k)
            log.info(f"held-out {self.held_out.label} {when}: {score:.3f}{sampled}")
            self.hooks.evaluated(self, {"eval/reward": score, **(self.eval_metrics or {})})
            if self.eval_failures:
                log.info(f"[warning] held-out evaluation {when}: {self.eval_failures}")
        return score
