"""The update: mu passes of the clipped policy-gradient loss over one batch of episodes (split
into minibatches, each its own optimizer step, with optim.steps_per_generation > 1).

What is fixed for the step (rows run and their order, micro-batches, padding passes that keep
ranks in lockstep, loss normalisers, reference log-probs, top-entropy token selection) is
prepared once per minibatch (`prepare`), before any optimizer step; the loop then reads like
cleanrl's minibatch loop: forward, loss, backward per micro-batch, one optimizer step per pass
and minibatch. Metrics stay on the device as float64
sums and reach the host once per pass (the loss and gradient norm decide whether the step is
applied) and once at the end.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch

from rlvr import algo
from rlvr.config import applied_sampler_correction
from rlvr.dist import full_weights_for_generation, loss_scale, no_grad_sync
from rlvr.models.compiled import CompileClock, CompiledForward
from rlvr.models.forward import completion_logprobs, eval_mode, trim_padding, uses_dropout
from rlvr.models.precision import autocast_context
from rlvr.rollout.episodes import Episodes
from rlvr.train.batch_plan import BatchPlan
from rlvr.train.fast_paths import fill_missing_grads, update_rows


@dataclass
class StepInputs:
    """Everything the passes over one batch share; prepared once per step."""

    episodes: Episodes  # the rows the update runs, in micro-batch order (on the training device)
    advantages: torch.Tensor  # [N] float32
    loss_mask: torch.Tensor  # [N, C] float32: model tokens that count (truncated episodes masked when asked)
    passes: list[tuple[slice, float]]  # (micro-batch, weight): weight-0 passes keep ranks in lockstep
    norms: algo.BatchNorms  # whole-batch normalisers (all ranks)
    ref_logp: torch.Tensor | None  # [N, C] reference log-probs when beta > 0
    entropy_weights: torch.Tensor | None  # [N, C] top-entropy token selection, when chosen before the loop
    old_logp: list[torch.Tensor | None]  # per micro-batch: the generating policy's log-probs (None: pass 1's own)
    sampled_entropy: torch.Tensor  # [2] float64: entropy sum and count of the sampled tokens known before the passes
    entropy_from_pass1: bool  # pass 1's forward adds the entropies of the rows it runs to sampled_entropy

    @property
    def micro_batch_sizes(self) -> list[int]:
        return [mb.stop - mb.start for mb, w in self.passes if w]


@dataclass
class UpdateResult:
    metrics: dict
    micro_batch_sizes: list[int]  # rows per forward/backward this step ran (this rank)
    skipped: bool  # a non-finite loss or gradient: the weights were not touched


class MetricSums:
    """Token-weighted sums of one step's metrics, kept on the device in float64."""

    def __init__(self, device):
        z = lambda: torch.zeros((), dtype=torch.float64, device=device)  # noqa: E731
        self.tokens, self.tokens_first, self.entropy, self.kl, self.gap, self.is_weight = z(), z(), z(), z(), z(), z()
        self.sampled_entropy = torch.zeros(2, dtype=torch.float64, device=device)  # entropy sum, tokens (pass 1's forward)
        self.clipped = [z(), z(), z()]  # low, high, region: fraction x tokens, summed over passes
        self.fractions: list[torch.Tensor] = []  # [3] (low, high, region) per micro-batch that can clip, for min/max
        self.gap_max = z()
        self.pass_loss = z()
        self.losses: list[float] = []  # per pass, on the host (they decide whether a pass is applied)
        self.grad_norms: list[float] = []
        self.learning_rates: list[float] = []  # per pass: the rate its optimizer step used (or would have)

    def add(self, res: algo.PolicyLossOutput, entropy: torch.Tensor, m: torch.Tensor, *, can_clip: bool) -> None:
        self.pass_loss += res.loss.detach().double()
        n = m.sum().double()
        fracs = torch.stack([res.low_clipped, res.high_clipped, res.region_clipped]).detach().double()
        if can_clip:
            self.fractions.append(fracs)
        for k in range(3):
            self.clipped[k] += fracs[k] * n
        self.tokens += n
        self.entropy += (entropy * m).sum().double()
        if res.kl is not None:
            self.kl += res.kl.double() * n

    def add_sampled_entropy(self, entropy: torch.Tensor, sampled: torch.Tensor) -> None:
        sampled = sampled.double()
        self.sampled_entropy += torch.stack([(entropy.double() * sampled).sum(), sampled.sum()])

    def add_sampler_gap(self, old_logp, sampling_logp, m, is_w) -> None:
        """How far the sampler's log-probs are from the trainer's (first pass only)."""
        gap = (old_logp - sampling_logp).abs() * m
        self.gap += gap.sum().double()
        if gap.numel():
            self.gap_max = torch.maximum(self.gap_max, gap.max().double())
        self.tokens_first += m.sum().double()
        if is_w is not None:
            self.is_weight += (is_w * m).sum().double()


class Updater:
    """Runs the update of one step on this rank's share of the batch."""

    def __init__(self, cfg, plan: BatchPlan, *, policy, train_model, optimizer, scheduler, dist, device, precision: str):
        """`precision`: the run's resolved model.autocast, `bf16` or `none` (rlvr.models.precision_choice)."""
        a = cfg.algo
        self.cfg, self.plan, self.policy, self.model, self.train_model = cfg, plan, policy, policy.model, train_model
        self.optimizer, self.scheduler, self.dist, self.device, self.precision = optimizer, scheduler, dist, device, precision
        self.loss_kwargs = dict(loss_type=a.loss_type, epsilon=a.epsilon, epsilon_high=a.epsilon_high, delta=a.delta,
                                importance_level=a.importance_sampling_level, beta=a.beta, kl_estimator=a.kl_estimator)
        self.loss_kwargs.update(  # the TRL loss types beyond the clipped one, the KL bias correction, the entropy bonus, OPSM
            sapo_temperature_pos=a.sapo_temperature_pos, sapo_temperature_neg=a.sapo_temperature_neg, vespo_k_pos=a.vespo_k_pos,
            vespo_lambda_pos=a.vespo_lambda_pos, vespo_k_neg=a.vespo_k_neg, vespo_lambda_neg=a.vespo_lambda_neg,
            kl_bias_correction=a.kl_bias_correction, entropy_coef=a.entropy_coef, off_policy_mask_threshold=a.off_policy_mask_threshold)
        self.correction = applied_sampler_correction(cfg)  # "none", or how to weight for the sampler/trainer mismatch
        self.max_norm = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else float("inf")
        self.dropout = uses_dropout(self.model)  # then old log-probs need a forward of their own (prepare)
        self.compiled = CompiledForward(device) if plan.compiled_forward else None  # the training forward only
        self.compile_clock = CompileClock()

    def __call__(self, episodes: Episodes, advantages: torch.Tensor, loss_weight: float = 1.0) -> UpdateResult:
        return self.update([(episodes, advantages, loss_weight)])

    def update(self, minibatches: list[tuple[Episodes, torch.Tensor, float]]) -> UpdateResult:
        """mu passes over the minibatches (train/minibatches.py), one optimizer step per minibatch and pass."""
        # Minibatches after the first train after an optimizer step: their old log-probs are taken now.
        steps = [self.prepare(e, adv, w, generating_logp=j > 0) for j, (e, adv, w) in enumerate(minibatches)]
        sums = MetricSums(self.device)
        compile_seconds = self.compile_clock.seconds
        with self.compile_clock.measuring() if self.compiled else contextlib.nullcontext():
            skipped = self.passes(steps, sums)
        metrics = self.finish(sums, steps)
        if self.compiled:
            metrics.update({"compile/count": self.compile_clock.graphs, "time/compile": self.compile_clock.seconds - compile_seconds})
        return UpdateResult(metrics, [n for s in steps for n in s.micro_batch_sizes], skipped)

    def passes(self, steps: list[StepInputs], sums: MetricSums) -> bool:
        """mu passes over every minibatch; True when one was skipped (a non-finite loss or gradient)."""
        for it, step in itertools.product(range(self.cfg.algo.num_iterations), steps):  # each pass: every minibatch
            self.optimizer.zero_grad(set_to_none=True)
            sums.pass_loss.zero_()
            for k, (mb, w_pass) in enumerate(step.passes):
                j = min(k, len(step.old_logp) - 1)  # padding passes repeat the last micro-batch
                last = k == len(step.passes) - 1  # gradients are reduced across ranks on the last backward only
                with no_grad_sync(self.dist, self.train_model, skip=not last):
                    out, C = self.forward(self.train_model, step.episodes, mb, with_entropy=True, compiled=self.compiled)
                m = step.loss_mask[mb, :C]
                own_old = step.old_logp[j] is None  # old log-probs from this very forward: ratio exactly 1, nothing clips
                if own_old:
                    step.old_logp[j] = out.logp.detach()
                old = step.old_logp[j]
                entropy = out.entropy.detach()  # out.entropy keeps its gradient for the entropy bonus
                w, is_w = self.token_weights(step, mb, C, entropy, m, old)
                if it == 0 and w_pass:
                    sums.add_sampler_gap(old, step.episodes.sampling_logprobs[mb, :C], m, is_w)
                    if step.entropy_from_pass1:
                        sums.add_sampled_entropy(entropy, step.episodes.loss_mask[mb, :C])
                ref = None if step.ref_logp is None else step.ref_logp[mb, :C]
                res = algo.policy_loss(out.logp, old, step.advantages[mb], m, step.norms, ref_logp=ref, token_weights=w, sampler_weights=is_w,
                                       sampling_logp=step.episodes.sampling_logprobs[mb, :C], entropy=out.entropy, **self.loss_kwargs)
                with no_grad_sync(self.dist, self.train_model, skip=not last):
                    (res.loss * (w_pass * loss_scale(self.dist))).backward()
                if w_pass:
                    sums.add(res, entropy, m, can_clip=not own_old)
            if not self.optimizer_step(sums, has_rows=bool(step.old_logp)):
                return True
        return False

    # ------------------------------------------------------------------ before the loop

    def prepare(self, episodes: Episodes, advantages: torch.Tensor, loss_weight: float, *, generating_logp: bool = False) -> StepInputs:
        a = self.cfg.algo
        mask = episodes.loss_mask.float()
        if a.mask_truncated_completions:
            mask = algo.mask_truncated(mask, episodes.truncated)
        # Normalisers: the whole batch over all ranks (a placeholder share counts 0), before any
        # zero-advantage rows are left out: the other rows' gradients stay what they were.
        n_seq, n_tok = self.dist.sum(loss_weight * len(episodes), loss_weight * float(mask.sum()), what="batch sizes")
        keep, mb_size = update_rows(advantages, episodes.lengths, episodes.group_ids, episodes.prompt_mask, self.plan)
        share = episodes  # every row of this rank's share, run or skipped
        if keep is not None:
            episodes, mask, advantages = episodes.select(keep), mask[keep], advantages[keep]
        n = len(episodes)
        mbs = _slices(n, mb_size)
        n_mb = self.dist.sum(loss_weight * len(mbs), what="micro-batches")[0]
        norms = algo.BatchNorms(num_sequences=int(n_seq), num_tokens=int(n_tok), max_completion_length=self.cfg.rollout.max_new_tokens,
                                num_micro_batches=max(int(n_mb), 1))
        # Every rank runs as many forward/backward passes as the busiest one (the gradient reduction
        # needs all of them); extra passes repeat the last micro-batch with weight 0.
        passes = [(mb, loss_weight) for mb in mbs]
        if mbs:
            passes += [(mbs[-1], 0.0)] * (int(self.dist.max(len(mbs), what="micro-batches")) - len(mbs))
        episodes = episodes.to(self.device)
        ref_logp = self.reference_logprobs(episodes, mbs) if a.beta > 0 else None
        # Old log-probs: the generating policy's as the sampler ran it, without dropout. Without dropout,
        # in the first minibatch, they are pass 1's own, detached: every micro-batch of pass 1 runs before
        # the first optimizer step, so the ratio is exactly 1 there, and passes 2..mu reuse them (no extra
        # forward). With dropout, or for a later minibatch (it trains after an optimizer step), a no-grad
        # forward in eval mode gives them here, before any optimizer step; pass 1's ratio then can clip.
        # Top-entropy tokens (80/20): chosen once per step over the whole batch, from the sampling
        # policy's entropies, so micro-batching does not change which tokens train. With one
        # micro-batch the first pass's own entropies serve (no extra forward; token_weights); they are
        # chosen here for a later minibatch and for the entropy bonus, which averages over the selected
        # tokens of the whole batch (the old log-probs' forward gives the entropies when it runs).
        select_now = a.top_entropy_quantile < 1 and bool(mbs) and (len(mbs) > 1 or generating_logp or a.entropy_coef != 0)
        old = None
        if self.dropout or generating_logp:
            old = self.fixed_forward(self.model, episodes, mbs, entropy=select_now or share.sampling_entropy is None)
        entropy_weights = None
        if select_now:
            outs = old or self.fixed_forward(self.model, episodes, mbs, entropy=True)
            entropy = _padded(outs, episodes.completion_ids.shape[1], entropy=True)
            entropy_weights = algo.high_entropy_mask(entropy.to(self.device), mask.to(self.device), a.top_entropy_quantile)
            norms = norms._replace(num_entropy_tokens=int(entropy_weights.sum()))
        sampled_entropy, from_pass1 = self.entropy_before_passes(share, keep, mb_size, episodes, old)
        return StepInputs(episodes, advantages.to(self.device, torch.float32), mask.to(self.device), passes, norms, ref_logp,
                          entropy_weights, [None] * len(mbs) if old is None else [o.logp for o in old],
                          loss_weight * sampled_entropy, from_pass1)

    def entropy_before_passes(self, share: Episodes, keep, mb_size: int, run: Episodes, old) -> tuple[torch.Tensor, bool]:
        """`entropy` is over every token the model sampled, trained or not: ([2] entropy sum and token
        count known before the passes, whether pass 1 adds those of the rows it runs). The sampler's
        entropies when the source gives them (no forward); otherwise a forward without dropout: pass 1's
        own (or the old log-probs' when prepare takes them), and one of their own for rows the update skips."""
        def sums(entropy: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
            sampled = sampled[:, : entropy.shape[1]].to(self.device, torch.float64)
            return torch.stack([(entropy.to(self.device, torch.float64) * sampled).sum(), sampled.sum()])

        if share.sampling_entropy is not None:
            return sums(share.sampling_entropy, share.loss_mask), False
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        if keep is not None and len(keep) < len(share):
            skipped = share.select(_other_rows(keep, len(share))).to(self.device)
            total += sums(self.fixed_logprobs(self.model, skipped, _slices(len(skipped), mb_size), entropy=True), skipped.loss_mask)
        for mb, o in zip(_slices(len(run), mb_size), old or []):
            total += sums(o.entropy, run.loss_mask[mb])
        return total, old is None

    def token_weights(self, step: StepInputs, mb: slice, C: int, entropy, m, old_logp):
        """(the top-entropy token selection or None, the sampler-correction weights or None)."""
        a = self.cfg.algo
        if a.top_entropy_quantile < 1 and step.entropy_weights is None:  # one micro-batch: the whole batch
            step.entropy_weights = algo.high_entropy_mask(entropy, m, a.top_entropy_quantile)
        w = None if step.entropy_weights is None else step.entropy_weights[mb, :C]
        is_w = None
        if self.correction != "none":  # the sampler's probabilities differ from the trainer's (vLLM)
            is_w = algo.sampler_correction(old_logp, step.episodes.sampling_logprobs[mb, :C], m, self.correction, a.sampler_correction_cap)
        return w, is_w

    # ------------------------------------------------------------------ forwards

    def forward(self, model, e: Episodes, mb: slice, *, with_entropy: bool, compiled: CompiledForward | None = None):
        """(log-probs and entropies of micro-batch mb, its completion width); `compiled`: through the compiled forward."""
        p_ids, p_mask, c_ids, c_mask = trim_padding(e.prompt_ids[mb], e.prompt_mask[mb], e.completion_ids[mb], e.attention_mask[mb])
        kw = dict(temperature=self.cfg.rollout.temperature, with_entropy=with_entropy, entropy_grad=self.cfg.algo.entropy_coef != 0)
        with autocast_context(self.precision, self.device):
            if compiled is not None:
                out = compiled(model, p_ids, p_mask, c_ids, c_mask, **kw)
            else:
                out = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, **kw, group_ids=e.group_ids[mb] if self.plan.shared_prefix else None)
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

    # ------------------------------------------------------------------ after each pass, after the step

    def optimizer_step(self, sums: MetricSums, *, has_rows: bool) -> bool:
        """Clip and apply the gradients of one pass; False (and nothing applied) when they are not finite."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not has_rows:
            fill_missing_grads(params)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_norm))
        loss = self.dist.sum(float(sums.pass_loss), what="loss")[0]
        sums.grad_norms.append(grad_norm)
        sums.losses.append(loss)
        sums.learning_rates.append(self.optimizer.param_groups[0]["lr"])
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)  # a non-finite step must not touch weights or optimizer state
            return False
        self.optimizer.step()
        self.scheduler.step()
        return True

    def finish(self, sums: MetricSums, steps: list[StepInputs]) -> dict:
        fr = torch.stack(sums.fractions).tolist() if sums.fractions else []
        sampled = sum(s.sampled_entropy for s in steps) + sums.sampled_entropy
        host = torch.stack([sums.tokens, sums.tokens_first, sums.entropy, sums.kl, sums.gap, sums.is_weight, *sums.clipped,
                            *sampled, sums.gap_max]).tolist()
        tokens, tokens_first, ent, kl, gap, isw, low, high, region, s_ent, s_tokens = self.dist.sum(*host[:11], what="metrics")
        # clip fractions: over each pass's whole minibatch (skipped rows: ratio 1, never clipped), averaged
        # over the passes (the optimizer steps run, minibatch after minibatch)
        passes_run = itertools.islice(itertools.cycle(steps), len(sums.losses))
        clip_tokens = max(float(sum(s.norms.num_tokens for s in passes_run)), 1.0)
        tokens_first = max(tokens_first, 1.0)
        metrics = {
            "loss": float(np.mean(sums.losses)),
            "grad_norm": float(np.mean(sums.grad_norms)),
            "learning_rate": float(np.mean(sums.learning_rates)),  # the scheduler has moved on to the next update's
            "clip_ratio/low_mean": low / clip_tokens,
            "clip_ratio/low_min": _finite_or_zero(self.dist.min(min((f[0] for f in fr), default=math.inf), what="metrics")),
            "clip_ratio/high_mean": high / clip_tokens,
            "clip_ratio/high_max": _finite_or_zero(self.dist.max(max((f[1] for f in fr), default=-math.inf), what="metrics")),
            "clip_ratio/region_mean": region / clip_tokens,
        }
        # entropy: every sampled token's; entropy/trained (and kl): the trained tokens', over the passes. Unknown is left out, not 0.
        if s_tokens:
            metrics["entropy"] = s_ent / s_tokens
        if tokens:
            metrics["entropy/trained"] = ent / tokens
        if self.cfg.algo.beta > 0:
            metrics["kl"] = kl / max(tokens, 1.0)
        metrics["sampler/logp_gap_mean"] = gap / tokens_first
        metrics["sampler/logp_gap_max"] = self.dist.max(host[11], what="metrics")
        if self.correction != "none":
            metrics["sampler/is_weight_mean"] = isw / tokens_first
        return metrics


def _slices(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _padded(outs: list, C: int, *, entropy: bool) -> torch.Tensor:
    """Per-micro-batch forwards (trimmed to their own longest completion) as one [N, C] tensor."""
    return torch.cat([torch.nn.functional.pad(o.entropy if entropy else o.logp, (0, C - o.logp.shape[1])) for o in outs])


def _other_rows(rows: torch.Tensor, n: int) -> torch.Tensor:
    """The row indices in range(n) that are not in `rows`."""
    left = torch.ones(n, dtype=torch.bool)
    left[rows] = False
    return left.nonzero().squeeze(-1)


def _finite_or_zero(x: float) -> float:
    """min/max over no micro-batch that could clip (mu = 1): nothing clipped, 0."""
    return x if math.isfinite(x) else 0.0
