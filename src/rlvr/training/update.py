"""Phase 3 of a step, the update: cleanrl's loop over this rank's minibatches (train/minibatches.py).

    for epoch in range(mu):                        # algo.num_iterations
        for minibatch in minibatches:              # optim.steps_per_generation, one optimizer step each
            for micro_batch in minibatch.micro_batches:   # optim.micro_batch_size rows: forward, loss, backward
                ...
            optimizer step

What every epoch of a minibatch reads is prepared once, before its first optimizer step, and never changed
(`MinibatchInputs`; `prepare`, split by what it prepares): the rows run and their order, the micro-batches
(with the repeats that keep ranks in lockstep), the loss normalisers, the reference log-probs, the old
log-probs, the top-entropy token selection. Where the first epoch's own forwards give the last two exactly
(no optimizer step before them), they are left unset rather than paid with a forward of their own; the first
epoch hands them on explicitly (`FirstEpoch`, `MinibatchInputs.after_first_epoch`). Metrics stay on the
device as float64 sums (update_metrics.py).
"""

from __future__ import annotations

import contextlib
import math

import torch

from rlvr import algo
from rlvr.config import applied_sampler_correction, sampler_is_trainer
from rlvr.dist import full_weights_for_generation, loss_scale, no_grad_sync
from rlvr.models.compiled import CompileClock, CompiledForward
from rlvr.models.denormals import flushing_denormals
from rlvr.models.forward import completion_logprobs, eval_mode, trim_padding, uses_dropout
from rlvr.models.precision import autocast_context
from rlvr.rollout.episodes import Episodes
from rlvr.training.batch_plan import BatchPlan
from rlvr.training.entropy_steering import EntropySteering
from rlvr.training.fast_paths import fill_missing_grads, masked_entropy_sum, other_rows, update_rows
from rlvr.training.minibatches import Minibatch
from rlvr.training.update_inputs import FirstEpoch, MicroBatch, MinibatchInputs, RowsToRun, UpdateResult, old_logprobs
from rlvr.training.update_metrics import MetricSums


class Updater:
    """Runs the update of one step on this rank's share of the batch."""

    def __init__(self, cfg, plan: BatchPlan, *, policy, train_model, optimizer, scheduler, dist, device, precision: str):
        """`precision`: the run's resolved model.autocast, `bf16` or `none` (rlvr.models.precision_choice)."""
        a = cfg.algo
        self.cfg, self.plan, self.policy, self.model, self.train_model = cfg, plan, policy, policy.model, train_model
        self.optimizer, self.scheduler, self.dist, self.device, self.precision = optimizer, scheduler, dist, device, precision
        self.loss_kwargs = dict(
            loss_type=a.loss_type,
            epsilon=a.epsilon,
            epsilon_high=a.epsilon_high,
            delta=a.delta,
            importance_level=a.importance_sampling_level,
            beta=a.beta,
            kl_estimator=a.kl_estimator,
        )
        self.loss_kwargs.update(  # the TRL loss types beyond the clipped one, the KL bias correction, the entropy bonus, OPSM
            sapo_temperature_pos=a.sapo_temperature_pos,
            sapo_temperature_neg=a.sapo_temperature_neg,
            vespo_k_pos=a.vespo_k_pos,
            vespo_lambda_pos=a.vespo_lambda_pos,
            vespo_k_neg=a.vespo_k_neg,
            vespo_lambda_neg=a.vespo_lambda_neg,
            kl_bias_correction=a.kl_bias_correction,
            entropy_coef=a.entropy_coef,
            off_policy_mask_threshold=a.off_policy_mask_threshold,
        )
        self.correction = applied_sampler_correction(cfg)  # "none", or how to weight for the sampler/trainer mismatch
        self.max_norm = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else float("inf")
        self.dropout = uses_dropout(self.model)  # then old log-probs need a forward of their own (prepare)
        # the sampler is the trained model, its distribution unfiltered: its log-probs are the policy's
        self.sampler_is_policy = sampler_is_trainer(cfg) and not cfg.rollout.reshapes_distribution
        self.compiled = CompiledForward(device) if plan.compiled_forward else None  # the training forward only
        self.compile_clock = CompileClock()
        # algo.adaptive_entropy: the controller's state (resumed from checkpoints by the trainer) and this step's window
        self.entropy_control = EntropySteering(cfg, device) if a.adaptive_entropy else None
        self.entropy_bonus = a.entropy_coef != 0 or a.adaptive_entropy  # the entropy then needs its gradient

    def __call__(self, episodes: Episodes, advantages: torch.Tensor, loss_weight: float = 1.0) -> UpdateResult:
        return self.update([Minibatch(episodes, advantages, loss_weight)])

    def update(self, minibatches: list[Minibatch]) -> UpdateResult:
        """mu epochs over the minibatches, one optimizer step per minibatch and epoch."""
        # on the CPU, subnormal floats flushed to zero: x86's slow path for them, off (rlvr.models.denormals)
        with flushing_denormals(self.cfg.flush_denormals and self.device.type == "cpu"):
            # Minibatches after the first train after an optimizer step: their old log-probs are taken now.
            inputs = [self.prepare(m, after_a_step=j > 0) for j, m in enumerate(minibatches)]
            sums = MetricSums(self.device)
            compile_seconds = self.compile_clock.seconds
            with self.compile_clock.measuring() if self.compiled else contextlib.nullcontext():
                skipped = self.run_epochs(inputs, sums)
        metrics = sums.metrics(inputs, self.dist, beta=self.cfg.algo.beta, correction=self.correction)
        if self.entropy_control is not None:
            metrics.update(self.entropy_control.metrics())
        if self.compiled:
            metrics.update({"compile/count": self.compile_clock.graphs, "time/compile": self.compile_clock.seconds - compile_seconds})
        return UpdateResult(metrics, [n for m in inputs for n in m.micro_batch_sizes], skipped)

    # ------------------------------------------------------------------ the loop

    def run_epochs(self, minibatches: list[MinibatchInputs], sums: MetricSums) -> bool:
        """Every epoch, one optimizer step per minibatch; True when one was skipped (a non-finite loss or gradient)."""
        minibatches = list(minibatches)
        for epoch in range(self.cfg.algo.num_iterations):
            for j, minibatch in enumerate(minibatches):
                first = FirstEpoch() if epoch == 0 else None
                if not self.minibatch_step(minibatch, first, sums):
                    return True
                if first is not None:
                    minibatches[j] = minibatch.after_first_epoch(first)
        return False

    def minibatch_step(self, minibatch: MinibatchInputs, first: FirstEpoch | None, sums: MetricSums) -> bool:
        """One optimizer step: forward, loss and backward per micro-batch (gradients accumulate), then the step.
        `first`: in the first epoch, what its forwards give the epochs after it. False when the step was skipped."""
        self.optimizer.zero_grad(set_to_none=True)
        sums.step_loss.zero_()
        if self.entropy_control is not None:  # every micro-batch of the step applies the coefficient the last step left
            self.loss_kwargs["entropy_coef"] = self.entropy_control.applied(minibatch.skipped_entropy)
        for k, micro_batch in enumerate(minibatch.micro_batches):
            last = k == len(minibatch.micro_batches) - 1  # gradients are reduced across ranks on the last backward only
            self.micro_batch_step(minibatch, micro_batch, first, sums, last=last)
        if self.entropy_control is not None:
            self.entropy_control.steer(self.dist)
        return self.optimizer_step(sums, has_rows=bool(minibatch.micro_batches))

    def micro_batch_step(
        self, minibatch: MinibatchInputs, micro_batch: MicroBatch, first: FirstEpoch | None, sums: MetricSums, *, last: bool
    ) -> None:
        """Forward, loss and backward of one micro-batch; its metrics added to `sums`."""
        rows, e = micro_batch.rows, minibatch.episodes
        with no_grad_sync(self.dist, self.train_model, skip=not last):
            out, C = self.forward(self.train_model, e, rows, with_entropy=True, compiled=self.compiled)
        m = minibatch.loss_mask[rows, :C]
        old, own_old = old_logprobs(minibatch, micro_batch.position, out, first)
        entropy = out.entropy.detach()  # out.entropy keeps its gradient for the entropy bonus
        selection, w, is_w = self.token_weights(minibatch, rows, C, entropy, m, old, first)
        if first is not None and micro_batch.weight:
            sums.add_sampler_gap(old, e.sampling_logprobs[rows, :C], m, is_w, per_sequence=self.correction.startswith("sequence"))
            if minibatch.entropy_from_first_epoch:
                sums.add_sampled_entropy(entropy, e.loss_mask[rows, :C])
        ref = None if minibatch.ref_logp is None else minibatch.ref_logp[rows, :C]
        penalty = None
        if self.cfg.algo.kl_cov_ratio and minibatch.cov_selection is not None:  # KL-Cov
            penalty = algo.kl_cov_penalty(out.logp, old, minibatch.cov_selection[rows, :C], coef=self.cfg.algo.kl_cov_coef)
        res = algo.policy_loss(
            out.logp,
            old,
            minibatch.advantages[rows],
            m,
            minibatch.norms,
            ref_logp=ref,
            token_weights=w,
            sampler_weights=is_w,
            sampling_logp=e.sampling_logprobs[rows, :C],
            entropy=out.entropy,
            token_penalty=penalty,
            entropy_weights=selection,
            **self.loss_kwargs,
        )
        with no_grad_sync(self.dist, self.train_model, skip=not last):
            (res.loss * (micro_batch.weight * loss_scale(self.dist))).backward()
        if micro_batch.weight:
            sums.add(res, entropy, m, can_clip=not own_old)
            if self.entropy_control is not None:
                self.entropy_control.add(entropy, m if selection is None else m * selection)

    def token_weights(self, minibatch: MinibatchInputs, rows: slice, C: int, entropy, m, old_logp, first: FirstEpoch | None):
        """(the top-entropy token selection, the policy-gradient term's weights: it times Clip-Cov's, the
        sampler-correction weights), each [n, C] or None. The entropy bonus and the controller count the selection."""
        a = self.cfg.algo
        selection = minibatch.entropy_weights
        if a.top_entropy_quantile < 1 and selection is None:  # one micro-batch: its first forward is the whole minibatch
            assert first is not None, "later epochs get the selection from the first (after_first_epoch)"
            if first.entropy_weights is None:
                first.entropy_weights = algo.high_entropy_mask(entropy, m, a.top_entropy_quantile)
            selection = first.entropy_weights
        selected = None if selection is None else selection[rows, :C]
        w = selected
        if a.clip_cov_ratio and minibatch.cov_selection is not None:  # Clip-Cov: its tokens' policy gradient detached
            clip = minibatch.cov_selection[rows, :C]
            w = clip if w is None else w * clip
        is_w = None
        if self.correction != "none":  # the sampler's probabilities differ from the trainer's (vLLM)
            sampling_logp = minibatch.episodes.sampling_logprobs[rows, :C]
            is_w = algo.sampler_correction(old_logp, sampling_logp, m, self.correction, a.sampler_correction_cap, a.sampler_correction_min)
        return selected, w, is_w

    def optimizer_step(self, sums: MetricSums, *, has_rows: bool) -> bool:
        """Clip and apply the accumulated gradients; False (and nothing applied) when they are not finite."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not has_rows:
            fill_missing_grads(params)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_norm))
        loss = self.dist.sum(float(sums.step_loss), what="loss")[0]
        sums.grad_norms.append(grad_norm)
        sums.losses.append(loss)
        sums.learning_rates.append(self.optimizer.param_groups[0]["lr"])
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)  # a non-finite step must not touch weights or optimizer state
            return False
        self.optimizer.step()
        self.scheduler.step()  # its count is the optimizer steps applied, over a resumed run's segments too
        sync = self.cfg.algo.ref_sync_steps if self.cfg.algo.beta > 0 else 0
        if sync and self.scheduler.last_epoch % sync == 0:  # TR-DPO / TRL's sync_ref_model
            self.policy.sync_reference(self.cfg.algo.ref_sync_alpha)
        return True

    # ------------------------------------------------------------------ before the loop

    def prepare(self, minibatch: Minibatch, *, after_a_step: bool = False) -> MinibatchInputs:
        """What every epoch of the minibatch reads, before its first optimizer step: the rows run and their micro-batches,
        the reference log-probs, the old log-probs, the top-entropy selection, the entropy of the sampled tokens.
        `after_a_step`: the minibatch trains after an optimizer step (every one but the first)."""
        rows = self.rows_to_run(minibatch)
        ref_logp = self.reference_logprobs(rows.episodes, rows.slices) if self.cfg.algo.beta > 0 else None
        select_now = self.selects_tokens_before_epochs(len(rows.slices), after_a_step)
        old = self.generating_forwards(rows, after_a_step, entropy=select_now or minibatch.episodes.sampling_entropy is None)
        entropy_weights, norms = self.top_entropy_tokens(rows, old) if select_now else (None, rows.norms)
        sampled_entropy, from_first_epoch, left_out_h = self.entropy_before_epochs(minibatch.episodes, rows, old)
        # the adaptive controller measures every loss token: the skipped rows' by the sampler's or that forward's entropies
        skipped_entropy = None if self.entropy_control is None else masked_entropy_sum(left_out_h, rows.left_out_mask)
        a = self.cfg.algo
        # no rows run (every advantage 0 under the skip): nothing to select from, nothing to detach or penalise
        cov = self.covariance_selection(rows, old) if (a.clip_cov_ratio or a.kl_cov_ratio) and rows.slices else None
        return MinibatchInputs(
            rows.episodes,
            rows.advantages,
            rows.loss_mask,
            rows.micro_batches,
            norms,
            ref_logp,
            None if old is None else tuple(o.logp for o in old),
            entropy_weights,
            minibatch.loss_weight * sampled_entropy,
            from_first_epoch,
            cov,
            None if skipped_entropy is None else skipped_entropy.to(self.device),
        )

    def covariance_selection(self, rows: RowsToRun, old: list | None) -> torch.Tensor:
        """[N, C] Clip-Cov's weights or KL-Cov's selected tokens, chosen once per minibatch before its epochs from the
        generating policy's log-probs over this rank's rows (verl: per micro-batch, from the current log-probs, which
        are those in the first epoch of a step's first minibatch). Clip-Cov draws with torch's generator, which
        checkpoints keep. Without old log-probs of its own (no dropout, the step's first minibatch) the in-process
        sampler's are the generating policy's, up to rounding: no forward runs for them."""
        a = self.cfg.algo
        e = rows.episodes
        if old is None and self.sampler_is_policy and e.sampling_entropy is not None and e.versions is None:  # it reports its sampler
            logp = e.sampling_logprobs.to(self.device)
        else:
            logp = _padded(old or self.fixed_forward(self.model, e, rows.slices), e.completion_ids.shape[1], entropy=False).to(self.device)
        if a.clip_cov_ratio:
            return algo.clip_cov_weights(
                logp, rows.advantages, rows.loss_mask, ratio=a.clip_cov_ratio, lower=a.clip_cov_lb, upper=a.clip_cov_ub
            )
        return algo.kl_cov_selection(logp, rows.advantages, rows.loss_mask, ratio=a.kl_cov_ratio)

    def rows_to_run(self, minibatch: Minibatch) -> RowsToRun:
        """The rows run (zero-advantage ones left out, packed by length when the plan says so), their
        micro-batches and the loss normalisers."""
        episodes, advantages, loss_weight = minibatch
        mask = episodes.loss_mask.float()
        if self.cfg.algo.mask_truncated_completions:
            mask = algo.mask_truncated(mask, episodes.truncated)
        # Normalisers: the whole minibatch over all ranks (a placeholder share counts 0), before any
        # zero-advantage rows are left out: the other rows' gradients stay what they were.
        n_seq, n_tok = self.dist.sum(loss_weight * len(episodes), loss_weight * float(mask.sum()), what="batch sizes")
        resting = self.entropy_control is not None and self.entropy_control.rests()  # adaptive_entropy, no bonus this step
        skip = self.plan.skip_zero_advantage or (self.plan.skip_while_no_bonus and resting)
        keep, size = update_rows(
            advantages, episodes.lengths, episodes.group_ids, episodes.prompt_mask, self.plan, skip_zero_advantage=skip
        )
        left_out_mask = None if keep is None else mask[other_rows(keep, len(mask))]
        if keep is not None:
            episodes, mask, advantages = episodes.select(keep), mask[keep], advantages[keep]
        slices = _slices(len(episodes), size)
        n_mb = self.dist.sum(loss_weight * len(slices), what="micro-batches")[0]
        norms = algo.BatchNorms(
            num_sequences=int(n_seq),
            num_tokens=int(n_tok),
            max_completion_length=self.cfg.rollout.max_new_tokens,
            num_micro_batches=max(int(n_mb), 1),
        )
        return RowsToRun(
            keep,
            episodes.to(self.device),
            advantages.to(self.device, torch.float32),
            mask.to(self.device),
            slices,
            size,
            self.lockstep(slices, loss_weight),
            norms,
            left_out_mask,
        )

    def lockstep(self, slices: list[slice], weight: float) -> tuple[MicroBatch, ...]:
        """This rank's micro-batches, then weight-0 repeats of the last until it runs as many forward/backward
        passes as the busiest rank (the gradient reduction needs all of them)."""
        if not slices:
            return ()
        busiest = int(self.dist.max(len(slices), what="micro-batches"))
        own = [MicroBatch(i, s, weight) for i, s in enumerate(slices)]
        return tuple(own + [MicroBatch(len(slices) - 1, slices[-1], 0.0)] * (busiest - len(slices)))

    def selects_tokens_before_epochs(self, micro_batches: int, after_a_step: bool) -> bool:
        """Top-entropy tokens (80/20) are chosen once per step over the whole minibatch, from the sampling policy's
        entropies, so micro-batching does not change which tokens train. With one micro-batch the first epoch's
        own entropies serve (no extra forward; FirstEpoch); they are chosen before the epochs for a minibatch
        trained after a step and for the entropy bonus, which averages over the selected tokens of the whole minibatch."""
        a = self.cfg.algo
        return a.top_entropy_quantile < 1 and micro_batches > 0 and (micro_batches > 1 or after_a_step or self.entropy_bonus)

    def generating_forwards(self, rows: RowsToRun, after_a_step: bool, *, entropy: bool) -> list | None:
        """The old log-probs' forwards (per micro-batch), or None when the first epoch's own serve (FirstEpoch).
        Old log-probs are the generating policy's as the sampler ran it, without dropout. With dropout, or for a
        minibatch trained after an optimizer step, a no-grad forward in eval mode gives them here, before any
        optimizer step; the first epoch's ratio then can clip."""
        if not (self.dropout or after_a_step):
            return None
        return self.fixed_forward(self.model, rows.episodes, rows.slices, entropy=entropy)

    def top_entropy_tokens(self, rows: RowsToRun, old: list | None) -> tuple[torch.Tensor, algo.BatchNorms]:
        """([N, C] the selected tokens, the normalisers counting them for the entropy bonus); the old log-probs'
        forward gives the entropies when it runs."""
        outs = old or self.fixed_forward(self.model, rows.episodes, rows.slices, entropy=True)
        entropy = _padded(outs, rows.episodes.completion_ids.shape[1], entropy=True)
        weights = algo.high_entropy_mask(entropy.to(self.device), rows.loss_mask, self.cfg.algo.top_entropy_quantile)
        return weights, rows.norms._replace(num_entropy_tokens=int(weights.sum()))

    def entropy_before_epochs(self, share: Episodes, rows: RowsToRun, old: list | None):
        """`entropy` is over every token the model sampled, trained or not: ([2] entropy sum and token
        count known before the epochs, whether the first epoch adds those of the rows it runs, [n, C'] the
        entropies of the rows the update skips or None). The sampler's entropies when the source gives them
        (no forward); otherwise a forward without dropout: the first epoch's own (or the old log-probs' when
        prepared), and one of their own for rows the update skips."""

        def sums(entropy: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
            sampled = sampled[:, : entropy.shape[1]].to(self.device, torch.float64)
            return torch.stack([(entropy.to(self.device, torch.float64) * sampled).sum(), sampled.sum()])

        left = None if rows.keep is None or len(rows.keep) == len(share) else other_rows(rows.keep, len(share))
        if share.sampling_entropy is not None:
            left_out = None if left is None else share.sampling_entropy[left]
            return sums(share.sampling_entropy, share.loss_mask), False, left_out
        total, left_out = torch.zeros(2, dtype=torch.float64, device=self.device), None
        if left is not None:
            skipped = share.select(left).to(self.device)
            left_out = self.fixed_logprobs(self.model, skipped, _slices(len(skipped), rows.micro_batch_size), entropy=True)
            total += sums(left_out, skipped.loss_mask)
        for mb, o in zip(rows.slices, old or []):
            total += sums(o.entropy, rows.episodes.loss_mask[mb])
        return total, old is None, left_out

    # ------------------------------------------------------------------ forwards

    def forward(self, model, e: Episodes, mb: slice, *, with_entropy: bool, compiled: CompiledForward | None = None):
        """(log-probs and entropies of micro-batch mb, its completion width); `compiled`: through the compiled forward."""
        p_ids, p_mask, c_ids, c_mask = trim_padding(e.prompt_ids[mb], e.prompt_mask[mb], e.completion_ids[mb], e.attention_mask[mb])
        kw = dict(temperature=self.cfg.rollout.temperature, with_entropy=with_entropy, entropy_grad=self.entropy_bonus)
        with autocast_context(self.precision, self.device, model):
            if compiled is not None:
                out = compiled(model, p_ids, p_mask, c_ids, c_mask, **kw)
            else:
                groups = e.group_ids[mb] if self.plan.shared_prefix else None
                out = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, **kw, group_ids=groups)
        return out, c_ids.shape[1]

    def reference_logprobs(self, e: Episodes, mbs: list[slice]) -> torch.Tensor:
        """Log-probs under the reference: the frozen copy, or (LoRA) the model with its adapter off."""
        with self.policy.reference() as ref:
            return self.fixed_logprobs(ref, e, mbs)

    def fixed_logprobs(self, model, e: Episodes, mbs: list[slice], *, entropy: bool = False) -> torch.Tensor:
        """Log-probs (or entropies) [N, C] of the episodes under a model that does not change during the step."""
        return _padded(self.fixed_forward(model, e, mbs, entropy=entropy), e.completion_ids.shape[1], entropy=entropy)

    @torch.no_grad()
    def fixed_forward(self, model, e: Episodes, mbs: list[slice], *, entropy: bool = False) -> list:
        """Per micro-batch, the log-probs (and entropies) under a model that does not change during
        the step, without dropout (eval mode, as the sampler runs it)."""
        # The policy itself (LoRA's reference is it with the adapter off) under FSDP2: gather its
        # weights once, on every rank. Per-forward all-gathers would pair up wrongly when ranks
        # have different numbers of micro-batches (uneven shares); no-op otherwise.
        with full_weights_for_generation(self.dist, self.model) if model is self.model else contextlib.nullcontext(), eval_mode(model):
            return [self.forward(model, e, mb, with_entropy=entropy)[0] for mb in mbs]


def _slices(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _padded(outs: list, C: int, *, entropy: bool) -> torch.Tensor:
    """Per-micro-batch forwards (trimmed to their own longest completion) as one [N, C] tensor."""
    return torch.cat([torch.nn.functional.pad(o.entropy if entropy else o.logp, (0, C - o.logp.shape[1])) for o in outs])
