"""The GRPO loop, top to bottom: sample prompts -> generate G each -> score -> advantages ->
mu clipped updates -> log -> checkpoint.

Departures from the seeds' GRPO, all settable: the loss is aggregated with DAPO's token mean
over the whole batch (`algo.loss_type=dapo`; the seeds' per-sequence mean is `grpo`), and the
KL penalty is off (`algo.beta=0`), in which case no reference model is loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from rlvr import algo
from rlvr.checkpoint import latest_checkpoint, remove_partial_checkpoints
from rlvr.config import Config, ConfigError, to_dict, validate
from rlvr.data import PromptStream, get_task, load_rows, render_prompt
from rlvr.data.checks import check_prompt_lengths, check_reward_columns
from rlvr.dist import Dist
from rlvr.evaluate import as_completions, evaluate
from rlvr.logging import NullLogger, RunLogger
from rlvr.metrics import batch_metrics, completion_rows
from rlvr.fastpaths import fill_missing_grads, update_rows
from rlvr.models.loading import load_tokenizer
from rlvr.models.lora import load_policy
from rlvr.plan import BatchPlan, batch_split_errors
from rlvr.policy import autocast_context, completion_logprobs, trim_padding
from rlvr.rewards import RewardRunner
from rlvr.rollout import Rollout, SamplingParams, make_engine
from rlvr.sharding import generate_sharded, local_share
from rlvr.trainer_checkpoint import resume_trainer, save_trainer_checkpoint
from rlvr.run_control import (
    StopRequest,
    TrainingError,
    lr_lambda,
    seed_everything,
    truncate_jsonl,
)


@dataclass
class Batch:
    """One step's completions with everything the update needs. N = groups x G rows."""

    rows: list[dict]  # [groups] dataset rows, one per prompt
    rollout: Rollout  # N completions, prompt-major
    rewards: torch.Tensor  # [N, K] one column per reward function, NaN = not applicable
    rounds: int  # generation rounds it took (dynamic sampling)
    prompts_consumed: int  # prompts drawn from the stream for it
    loss_weight: float = 1.0  # 0: a placeholder share that only keeps a rank in step (rlvr.sharding)


class Trainer:
    def __init__(self, cfg: Config, *, force: bool = False, logger_live: bool | None = None):
        self.cfg = cfg
        self.warnings = validate(cfg, force=force)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else ("cpu" if cfg.device == "auto" else cfg.device))
        if self.device.type == "cuda" and "LOCAL_RANK" in __import__("os").environ:
            self.device = torch.device("cuda", int(__import__("os").environ["LOCAL_RANK"]))
        self.dist = Dist.from_env(backend=cfg.dist.backend, timeout=cfg.dist.timeout, device=self.device)
        if self.dist.world_size != cfg.nproc and cfg.nproc > 1:
            raise ConfigError(f"`nproc`={cfg.nproc} but torchrun started {self.dist.world_size} processes: set nproc={self.dist.world_size}, or launch with `rlvr train nproc=N`")
        if split_errors := batch_split_errors(cfg, self.dist.world_size):
            raise ConfigError("invalid config:\n  - " + "\n  - ".join(split_errors))
        seed_everything(cfg.seed)

        self.tokenizer, notes = load_tokenizer(cfg.model.path, cfg.model.trust_remote_code, cfg.model.gguf_file)
        self.warnings += notes
        # beta = 0: no reference model exists at all (memory); the KL term is never computed.
        # LoRA: the reference is the same weights with the adapter disabled (no copy).
        self.policy = load_policy(cfg.model, self.device, beta=cfg.algo.beta)
        self.model, self.ref_model = self.policy.model, self.policy.ref_model
        self.train_model = self.dist.wrap(self.model, cfg.dist.strategy)  # DDP / FSDP2, or the model itself
        # The prompt-once training forward needs a KV cache in training mode: not under DDP/FSDP
        # wrappers, and not with gradient checkpointing (which turns the cache off).
        self._shared_prefix = cfg.optim.shared_prefix and self.dist.world_size == 1 and not cfg.model.gradient_checkpointing
        self.plan = BatchPlan.build(cfg, self.dist.world_size, self.model)
        self.engine = make_engine(cfg.rollout.engine, self.model, self.tokenizer, cfg, save_adapter=self.policy.save)
        self.rewards = RewardRunner.from_config(cfg.rewards)

        self.task = None
        if cfg.data.task:
            d = cfg.data
            self.task = get_task(d.task, seed=cfg.seed, digits=d.digits, operators=d.operators, eval_size=d.eval_size)
            self.stream = PromptStream(self.task.train_row, None, seed=cfg.seed)
        else:
            rows = load_rows(cfg.data.path, prompt_column=cfg.data.prompt_column, split=cfg.data.split, subset=cfg.data.subset)
            self.stream = PromptStream.from_rows(rows, seed=cfg.seed, shuffle=cfg.data.shuffle)

        check_reward_columns(self.rewards.fns, self.stream.take(1)[0])
        self.stream.position = 0
        self.context_length = getattr(self.model.config, "max_position_embeddings", None)

        params = [p for p in self.model.parameters() if p.requires_grad]
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
        total_updates = cfg.steps * cfg.algo.num_iterations
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(o.lr_schedule, o.warmup_steps, total_updates))
        self.sampling = SamplingParams(
            n=cfg.rollout.group_size,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            max_new_tokens=cfg.rollout.max_new_tokens,
            ignore_eos=cfg.rollout.ignore_eos,
        )
        self.output_dir = Path(cfg.output_dir or time.strftime("runs/%Y%m%d-%H%M%S"))
        self.step = 0
        self.resumed_from: Path | None = None
        self.num_tokens = 0
        self.skipped_steps = 0  # steps whose update was dropped for a non-finite loss or gradient
        self.bad_steps_in_a_row = 0
        self._reward_time = 0.0  # seconds spent in reward functions this step (collect() adds to it)
        previous = self.output_dir / "metrics.jsonl"
        if not cfg.resume and previous.exists() and previous.stat().st_size and not force:
            raise ConfigError(
                f"output_dir {self.output_dir} already holds a run (metrics.jsonl): pass resume=auto to continue it, "
                "choose another output_dir, or --force to start over in it"
            )
        if self.dist.is_main:
            remove_partial_checkpoints(self.output_dir / "checkpoints")
        if cfg.resume:
            self._resume(cfg.resume, force)
        self.logger_live = logger_live

    # ------------------------------------------------------------------ generation and scoring

    def _generate_and_score(self, rows: list[dict], first_position: int) -> tuple[Rollout, torch.Tensor]:
        G = self.cfg.rollout.group_size
        prompts = [render_prompt(r["prompt"], self.tokenizer, self.cfg.data.system_prompt) for r in rows]
        check_prompt_lengths(prompts, self.tokenizer, self.context_length, self.cfg.rollout.max_new_tokens)
        # Prompt i's sampling noise is seeded by its position in the data stream: the same
        # prompt gets the same completions whatever batch, rank or resume it lands in.
        seeds = [self.cfg.seed * 2**32 + first_position + i for i in range(len(rows))]
        with autocast_context(self.cfg.model.autocast, self.device):
            rollout = self.engine.generate(prompts, self.sampling, seeds)
        columns = {k: [r.get(k) for r in rows for _ in range(G)] for k in rows[0] if k != "prompt"}
        t = time.perf_counter()
        rewards = self.rewards(
            [r["prompt"] for r in rows for _ in range(G)],
            as_completions(rows, rollout.texts),
            columns,
            completion_ids=[ids[m.bool()].tolist() for ids, m in zip(rollout.completion_ids, rollout.completion_mask)],
        )
        self._reward_time += time.perf_counter() - t
        return rollout, rewards

    def collect(self) -> Batch:
        """Generate and score a batch. With dynamic sampling, groups whose rewards are all equal
        are dropped and fresh prompts generated until the batch is full or the rounds run out."""
        cfg, G = self.cfg, self.cfg.rollout.group_size
        want = cfg.rollout.prompts_per_step
        kept_rows, kept_rollouts, kept_rewards = [], [], []
        rounds, consumed = 0, 0
        while True:
            need = want - len(kept_rows)
            position = self.stream.position
            rows = self.stream.take(need)
            consumed += need
            rounds += 1
            rollout, rewards = generate_sharded(self, rows, position)  # every rank: the whole round
            if not cfg.algo.dynamic_sampling:
                return Batch(rows, rollout, rewards, rounds, consumed)
            signal = algo.groups_with_signal(rewards, self.rewards.weights, G, mode=cfg.algo.reward_aggregation)
            keep_groups = signal.nonzero().squeeze(-1).tolist()
            if keep_groups:
                idx = torch.tensor([g * G + j for g in keep_groups for j in range(G)])
                kept_rows += [rows[g] for g in keep_groups]
                kept_rollouts.append(rollout.select(idx))
                kept_rewards.append(rewards[idx])
            if len(kept_rows) == want or rounds > cfg.algo.max_resample_rounds:
                break
        if not kept_rows:  # nothing had signal: train on the last round (zero advantages, zero update)
            return Batch(rows, rollout, rewards, rounds, consumed)
        merged = Rollout.concat(kept_rollouts, self.tokenizer.pad_token_id)
        return Batch(kept_rows, merged, torch.cat(kept_rewards), rounds, consumed)

    # ------------------------------------------------------------------ the update

    def _micro_batches(self, n: int, size: int | None = None) -> list[slice]:
        size = (self.cfg.optim.micro_batch_size if size is None else size) or n
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def _forward(self, model, r: Rollout, mb: slice, *, with_entropy: bool):
        p_ids, p_mask, c_ids, c_mask = trim_padding(r.prompt_ids[mb], r.prompt_mask[mb], r.completion_ids[mb], r.completion_mask[mb])
        with autocast_context(self.cfg.model.autocast, self.device):
            out = completion_logprobs(
                model, p_ids.to(self.device), p_mask.to(self.device), c_ids.to(self.device), c_mask.to(self.device),
                temperature=self.cfg.rollout.temperature, with_entropy=with_entropy, shared_prefix=self._shared_prefix,
            )
        return out, c_ids.shape[1]

    def _reference_logprobs(self, r: Rollout, mbs: list[slice]) -> torch.Tensor:
        """Log-probs under the reference: the frozen copy, or (LoRA) the model with its adapter off."""
        with self.policy.reference() as ref:
            return self._fixed_logprobs(ref, r, mbs)

    @torch.no_grad()
    def _fixed_logprobs(self, model, r: Rollout, mbs: list[slice], *, entropy: bool = False) -> torch.Tensor:
        """Log-probs (or entropies) of the batch under a model that does not change during the step."""
        C = r.completion_ids.shape[1]
        parts = []
        # The policy itself (LoRA's reference is it with the adapter off) under FSDP2: gather its
        # weights once, on every rank. Per-forward all-gathers would pair up wrongly when ranks
        # have different numbers of micro-batches (uneven shares); no-op otherwise.
        with self.dist.full_weights_for_generation(self.model) if model is self.model else contextlib.nullcontext():
            for mb in mbs:
                out, width = self._forward(model, r, mb, with_entropy=entropy)
                parts.append(torch.nn.functional.pad(out.entropy if entropy else out.logp, (0, C - width)))
        return torch.cat(parts)

    def update(self, batch: Batch, advantages: torch.Tensor) -> dict:
        cfg, a = self.cfg, self.cfg.algo
        r = batch.rollout
        mask = r.completion_mask.float()
        if a.mask_truncated_completions:
            mask = algo.mask_truncated(mask, r.truncated)
        # Fast paths (single process): rows whose gradient is exactly zero (advantage 0) are left
        # out of the forward and backward, and rows are sorted by length into micro-batches when
        # that pads less. The normalisers below still count the whole batch.
        o = cfg.optim
        keep, mb_size = None, None
        if self.dist.world_size == 1:
            keep, mb_size = update_rows(advantages, mask, r.prompt_mask, group_size=cfg.rollout.group_size, micro_batch_size=o.micro_batch_size,
                                        skip_zero_advantage=o.skip_zero_advantage, pack_by_length=o.pack_by_length, shared_prefix=o.shared_prefix,
                                        beta=a.beta, loss_type=a.loss_type, top_entropy_quantile=a.top_entropy_quantile)
        wt = batch.loss_weight  # normalisers: the whole batch over all ranks (placeholder shares count 0)
        n_seq, n_tok = self.dist.sum(wt * len(r), wt * float(mask.sum()), what="batch sizes")
        if keep is not None:
            r, mask, advantages = r.select(keep), mask[keep], advantages[keep]
        mbs = self._micro_batches(len(r), mb_size) if len(r) else []
        n_mb = self.dist.sum(wt * len(mbs), what="micro-batches")[0]
        norms = algo.BatchNorms(
            num_sequences=int(n_seq),
            num_tokens=int(n_tok),
            max_completion_length=cfg.rollout.max_new_tokens,
            num_micro_batches=max(int(n_mb), 1),
        )
        # Every rank runs as many forward/backward passes as the busiest one (the gradient reduction
        # needs all of them); extra passes repeat the last micro-batch with weight 0.
        passes = [(mb, wt) for mb in mbs]
        if mbs:
            passes += [(mbs[-1], 0.0)] * (int(self.dist.max(len(mbs), what="micro-batches")) - len(mbs))
        ref_logp = self._reference_logprobs(r, mbs) if a.beta > 0 else None
        # Top-entropy tokens (80/20): chosen once per step over the whole batch, from the sampling
        # policy's entropies, so micro-batching does not change which tokens train. With one
        # micro-batch the first pass's own entropies serve (no extra forward).
        weights = None
        if a.top_entropy_quantile < 1 and len(mbs) > 1:
            entropy = self._fixed_logprobs(self.model, r, mbs, entropy=True).to(self.device)
            weights = algo.high_entropy_mask(entropy, mask.to(self.device), a.top_entropy_quantile)
        # Old log-probs: those of the first pass, detached. Every micro-batch of the first pass runs
        # before the first optimizer step, so they are the generating policy's (ratio exactly 1
        # there), and they are reused unchanged by passes 2..mu (no extra forward).
        old_logp: list[torch.Tensor | None] = [None] * len(mbs)
        adv = advantages.to(self.device, torch.float32)
        stats = {"loss": [], "low": [], "high": [], "region": [], "grad_norm": []}
        tokens = tokens_1 = ent_sum = kl_sum = gap_sum = gap_max = isw_sum = 0.0
        clip_sums = [0.0, 0.0, 0.0]
        skipped = False
        correction = cfg.sampler_correction
        correct_sampler = correction != "none"
        for it in range(a.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for k, (mb, w_pass) in enumerate(passes):
                j = min(k, len(mbs) - 1)
                with self.dist.no_grad_sync(self.train_model, skip=k < len(passes) - 1):
                    out, C = self._forward(self.train_model, r, mb, with_entropy=True)
                m = mask[mb, :C].to(self.device)
                if old_logp[j] is None:
                    old_logp[j] = out.logp.detach()
                ref = None if ref_logp is None else ref_logp[mb, :C].to(self.device)
                if a.top_entropy_quantile < 1 and weights is None:  # one micro-batch: the whole batch
                    weights = algo.high_entropy_mask(out.entropy, m, a.top_entropy_quantile)
                w = None if weights is None else weights[mb, :C]
                if correct_sampler:  # the sampler's probabilities differ from the trainer's (vLLM)
                    is_w = algo.sampler_correction(old_logp[j], r.sampling_logprobs[mb, :C].to(self.device), m, correction, a.sampler_correction_cap)
                    w = is_w if w is None else w * is_w
                if it == 0 and w_pass:  # how far the sampler's log-probs are from the trainer's, per token
                    gap = (old_logp[j] - r.sampling_logprobs[mb, :C].to(self.device)).abs() * m
                    gap_sum, gap_max = gap_sum + float(gap.sum()), max(gap_max, float(gap.max()) if gap.numel() else 0.0)
                    tokens_1 += float(m.sum())
                    if correct_sampler:
                        isw_sum += float((is_w * m).sum())
                res = algo.policy_loss(
                    out.logp, old_logp[j], adv[mb], m, norms,
                    loss_type=a.loss_type, epsilon=a.epsilon, epsilon_high=a.epsilon_high, delta=a.delta,
                    importance_level=a.importance_sampling_level, beta=a.beta, ref_logp=ref,
                    kl_estimator=a.kl_estimator, token_weights=w,
                )
                with self.dist.no_grad_sync(self.train_model, skip=k < len(passes) - 1):
                    (res.loss * (w_pass * self.dist.loss_scale)).backward()
                if not w_pass:
                    continue
                step_loss += res.loss.item()
                # Per micro-batch fractions (for the min/max metrics) and token-weighted sums (means).
                n = float(m.sum())
                fracs = (res.low_clipped.item(), res.high_clipped.item(), res.region_clipped.item())
                for key, v in zip(("low", "high", "region"), fracs):
                    stats[key].append(v)
                clip_sums = [cs + v * n for cs, v in zip(clip_sums, fracs)]
                tokens += n
                ent_sum += float((out.entropy * m).sum())
                if res.kl is not None:
                    kl_sum += res.kl.item() * n
            params = [p for p in self.model.parameters() if p.requires_grad]
            if not mbs:
                fill_missing_grads(params)
            max_norm = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            step_loss = self.dist.sum(step_loss, what="loss")[0]
            stats["grad_norm"].append(grad_norm)
            stats["loss"].append(step_loss)
            if not (math.isfinite(step_loss) and math.isfinite(grad_norm)):
                # A non-finite loss or gradient must not touch the weights or the optimizer state.
                self.optimizer.zero_grad(set_to_none=True)
                skipped = True
                break
            self.optimizer.step()
            self.scheduler.step()
        tokens, tokens_1, ent_sum, kl_sum, gap_sum, isw_sum, *clip_sums = self.dist.sum(
            tokens, tokens_1, ent_sum, kl_sum, gap_sum, isw_sum, *clip_sums, what="metrics")
        tokens = max(tokens, 1.0)  # tokens trained (entropy and KL are theirs)
        all_tokens = max(float(n_tok), 1.0)  # clip fractions are over the whole batch (skipped rows: ratio 1, never clipped)
        metrics = {
            "loss": float(np.mean(stats["loss"])),
            "grad_norm": float(np.mean(stats["grad_norm"])),
            "entropy": ent_sum / tokens,
            "clip_ratio/low_mean": clip_sums[0] / all_tokens,
            "clip_ratio/low_min": self.dist.min(float(np.min(stats["low"] or [0.0])), what="metrics"),
            "clip_ratio/high_mean": clip_sums[1] / all_tokens,
            "clip_ratio/high_max": self.dist.max(float(np.max(stats["high"] or [0.0])), what="metrics"),
            "clip_ratio/region_mean": clip_sums[2] / all_tokens,
        }
        if ref_logp is not None:
            metrics["kl"] = kl_sum / tokens
        tokens_1 = max(tokens_1, 1.0)
        metrics["sampler/logp_gap_mean"] = gap_sum / tokens_1
        metrics["sampler/logp_gap_max"] = self.dist.max(gap_max, what="metrics")
        if correct_sampler:
            metrics["sampler/is_weight_mean"] = isw_sum / tokens_1
        self.skipped_steps += skipped
        self.bad_steps_in_a_row = self.bad_steps_in_a_row + 1 if skipped else 0
        metrics["skipped_steps"] = self.skipped_steps
        return metrics

    # ------------------------------------------------------------------ one step, the loop

    def train_step(self) -> dict:
        cfg, G = self.cfg, self.cfg.rollout.group_size
        t0 = time.perf_counter()
        self._reward_time = 0.0
        errors_before = dict(self.rewards.total_errors)
        batch = self.collect()
        t_collect = time.perf_counter() - t0
        a = cfg.algo
        advantages = algo.combine_rewards(
            batch.rewards, self.rewards.weights, G, mode=a.reward_aggregation, scale=a.scale_rewards, ddof=a.std_ddof
        )
        t1 = time.perf_counter()
        metrics = self.update(*local_share(batch, advantages, self.dist, G))  # this rank's groups
        self.engine.sync_weights()  # a separate sampler (vLLM) gets the new weights; hf shares them
        t_train = time.perf_counter() - t1
        self.step += 1
        r = batch.rollout
        self.num_tokens += int(r.prompt_mask.sum() + r.completion_mask.sum())
        metrics.update(batch_metrics(batch, advantages, self.rewards.names, self.rewards.weights, G))
        if cfg.algo.dynamic_sampling:
            metrics.update({"sampling/rounds": batch.rounds, "sampling/prompts_consumed": batch.prompts_consumed,
                            "sampling/groups_kept": len(batch.rows)})
        for name, total in self.rewards.total_errors.items():  # failed samples, all rounds of this step
            metrics[f"rewards/{name}/errors"] = total - errors_before.get(name, 0)
        metrics.update({
            "step": self.step,
            "learning_rate": self.scheduler.get_last_lr()[0],
            "num_tokens": self.num_tokens,
            "time/generate": t_collect - self._reward_time,
            "time/reward": self._reward_time,
            "time/train": t_train,
            "time/step": time.perf_counter() - t0,
        })
        if self.device.type == "cuda":
            metrics["memory/peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        self._last_batch = (batch, advantages)
        return metrics

    def evaluate(self) -> float | None:
        """Held-out accuracy, on rank 0 (None on the others). Every rank must call it: under FSDP2
        they all take part in gathering the full weights, then wait while rank 0 generates."""
        if self.task is None:
            return None
        runner = RewardRunner.from_config([dataclasses.replace(self.cfg.rewards[0], fn=self.task.reward, name="eval", weight=1.0)])
        with self.dist.full_weights_for_generation(self.model):
            if not self.dist.is_main:
                return None
            return evaluate(self.engine, self.tokenizer, self.task.eval_rows(), runner, max_new_tokens=self.cfg.rollout.max_new_tokens)

    def train(self) -> dict:
        cfg = self.cfg
        out, main = self.output_dir, self.dist.is_main  # only rank 0 writes logs, samples, checkpoints
        if main:
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.yaml").write_text(_yaml(to_dict(cfg)))
        if main:
            # Resuming: steps after the checkpoint (all of them when there is none yet) are done
            # again. A fresh start (step 0) in a used folder, which only --force allows, starts the
            # logs over instead of appending to the old run's.
            truncate_jsonl(out / "metrics.jsonl", self.step)
            truncate_jsonl(out / "samples.jsonl", self.step)
        log = RunLogger(out, cfg.steps, self.step, live=self.logger_live, config=cfg) if main else NullLogger()
        for w in self.warnings:
            log.info(f"[note] {w}")
        log.info(self.plan.describe())
        summary: dict = {"output_dir": str(out)}
        stop = StopRequest()
        try:
            if cfg.eval_before_after and self.task is not None and self.step == 0:
                if (acc := self.evaluate()) is not None:  # every rank calls it (FSDP2); rank 0's number
                    summary["eval_before"] = acc
                    log.info(f"held-out accuracy before training: {acc:.3f}")
            t_start = time.time()
            while self.step < cfg.steps:
                metrics = self.train_step()
                log.log(metrics)
                if cfg.log_completions_every and self.step % cfg.log_completions_every == 0:
                    log.samples(completion_rows(*self._last_batch, self.rewards.names, cfg.rollout.group_size, self.step, cfg.num_completions_logged))
                if self.bad_steps_in_a_row:
                    log.info(f"[warning] step {self.step}: non-finite loss or gradient, update skipped ({self.skipped_steps} so far)")
                    if self.bad_steps_in_a_row >= cfg.max_bad_steps:
                        last = latest_checkpoint(out / "checkpoints")
                        raise TrainingError(
                            f"{self.bad_steps_in_a_row} steps in a row had a non-finite loss or gradient (max_bad_steps={cfg.max_bad_steps}); "
                            f"stopping. Last good checkpoint: {last or 'none'}. Lower optim.lr or check the rewards."
                        )
                    continue  # never checkpoint right after a bad step
                if self.dist.max(float(stop.requested is not None), what="stop request"):  # all ranks stop together
                    path = self.save_checkpoint()
                    log.info(f"stopped by {stop.requested} at step {self.step}; checkpoint {path}. Resume with: rlvr train ... output_dir={out} resume=auto")
                    summary["interrupted_at"] = self.step
                    return summary
                if cfg.save_every and self.step % cfg.save_every == 0 and self.step < cfg.steps:
                    self.save_checkpoint()
            summary["train_seconds"] = time.time() - t_start
            # FSDP2: whole weights on rank 0, named as the model `policy.save` writes (the peft wrapper with LoRA)
            full = self.dist.full_model_state(self.policy.peft or self.model)
            if main:
                self.policy.save(out / "final", full)
                self.tokenizer.save_pretrained(out / "final")
                if cfg.model.lora.save_merged:
                    self.policy.save_merged(out / "final-merged")
                    self.tokenizer.save_pretrained(out / "final-merged")
            if cfg.eval_before_after and self.task is not None:
                if (acc := self.evaluate()) is not None:
                    summary["eval_after"] = acc
                    log.info(f"held-out accuracy after training: {acc:.3f}")
            if main:
                (out / "summary.json").write_text(json.dumps(summary, indent=2))
            self.dist.barrier("end of training")
        finally:
            stop.restore()
            log.close()
        return summary

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Rank 0 writes; every rank resumes from it (rlvr.trainer_checkpoint)."""
        return save_trainer_checkpoint(self)

    def _resume(self, where: str, force: bool) -> None:
        resume_trainer(self, where, force)


def _yaml(d: dict) -> str:
    return yaml.safe_dump(d, sort_keys=False)
