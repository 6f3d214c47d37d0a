"""The update's metrics (TRL's names): token-weighted sums kept on the device in float64 while the epochs run,
reduced across ranks and brought to the host once at the end. Only each optimizer step's loss and gradient norm
reach the host before (they decide whether the step is applied)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from rlvr import algo


class MetricSums:
    """Token-weighted sums of one update's metrics, kept on the device in float64."""

    def __init__(self, device):
        z = lambda: torch.zeros((), dtype=torch.float64, device=device)  # noqa: E731
        self.tokens, self.tokens_first, self.entropy, self.kl, self.gap = z(), z(), z(), z(), z()
        self.is_weight, self.is_count = z(), z()  # the correction's weights summed, and how many: tokens or completions
        self.sampled_entropy = torch.zeros(2, dtype=torch.float64, device=device)  # entropy sum, tokens (the first epoch's forward)
        self.clipped = [z(), z(), z()]  # low, high, region: fraction x tokens, summed over the optimizer steps
        self.fractions: list[torch.Tensor] = []  # [3] (low, high, region) per micro-batch that can clip, for min/max
        self.gap_max = z()
        self.is_range = torch.tensor([math.inf, -math.inf], dtype=torch.float64, device=device)  # the weights' min, max
        self.step_loss = z()  # the loss of the optimizer step being accumulated (its micro-batches')
        self.losses: list[float] = []  # per optimizer step, on the host (they decide whether a step is applied)
        self.grad_norms: list[float] = []
        self.learning_rates: list[float] = []  # per optimizer step: the rate it used (or would have)

    def add(self, res: algo.PolicyLossOutput, entropy: torch.Tensor, m: torch.Tensor, *, can_clip: bool) -> None:
        self.step_loss += res.loss.detach().double()
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

    def add_sampler_gap(self, old_logp, sampling_logp, m, is_w, *, per_sequence: bool = False) -> None:
        """How far the sampler's log-probs are from the trainer's (first epoch only); is_w: the correction's weights,
        [n, C] or (per_sequence) [n, 1]."""
        gap = (old_logp - sampling_logp).abs() * m
        self.gap += gap.sum().double()
        if gap.numel():
            self.gap_max = torch.maximum(self.gap_max, gap.max().double())
        self.tokens_first += m.sum().double()
        if is_w is not None:
            if per_sequence:  # one weight per completion: their mean over completions, as TRL's
                trained = m.sum(-1, keepdim=True) > 0  # [n, 1]
                self.is_weight += (is_w * trained).sum().double()
                self.is_count += trained.sum().double()
            else:
                self.is_weight += (is_w * m).sum().double()
                self.is_count += m.sum().double()
            off = ~(m.bool() & torch.ones_like(is_w, dtype=torch.bool))  # [n, C] not a loss token (a sequence's weight: each)
            w = is_w.expand_as(off).double()  # no host sync: an empty micro-batch gives inf / -inf, which min / max keep
            low, high = w.masked_fill(off, math.inf).min(), w.masked_fill(off, -math.inf).max()
            self.is_range = torch.stack([torch.minimum(self.is_range[0], low), torch.maximum(self.is_range[1], high)])

    def metrics(self, minibatches: list, dist, *, beta: float, correction: str) -> dict:
        """The update's metrics over every rank. `minibatches`: the MinibatchInputs the epochs ran (their
        normalisers and the sampled-token entropy known before the epochs)."""
        fr = torch.stack(self.fractions).tolist() if self.fractions else []
        sampled = sum(s.sampled_entropy for s in minibatches) + self.sampled_entropy
        sums = [self.tokens, self.tokens_first, self.entropy, self.kl, self.gap, self.is_weight, self.is_count, *self.clipped, *sampled]
        host = torch.stack([*sums, self.gap_max, *self.is_range]).tolist()  # the one trip to the host
        tokens, tokens_first, ent, kl, gap, isw, is_count, low, high, region, s_ent, s_tokens = dist.sum(*host[:12], what="metrics")
        # clip fractions: over each optimizer step's whole minibatch (skipped rows: ratio 1, never clipped), averaged
        # over the optimizer steps run (minibatch after minibatch, epoch after epoch)
        steps_run = itertools.islice(itertools.cycle(minibatches), len(self.losses))
        clip_tokens = max(float(sum(s.norms.num_tokens for s in steps_run)), 1.0)
        tokens_first = max(tokens_first, 1.0)
        metrics = {
            "loss": float(np.mean(self.losses)),
            "grad_norm": float(np.mean(self.grad_norms)),
            "learning_rate": float(np.mean(self.learning_rates)),  # the scheduler has moved on to the next update's
            "clip_ratio/low_mean": low / clip_tokens,
            "clip_ratio/low_min": _finite_or_zero(dist.min(min((f[0] for f in fr), default=math.inf), what="metrics")),
            "clip_ratio/high_mean": high / clip_tokens,
            "clip_ratio/high_max": _finite_or_zero(dist.max(max((f[1] for f in fr), default=-math.inf), what="metrics")),
            "clip_ratio/region_mean": region / clip_tokens,
        }
        # entropy: every sampled token's; entropy/trained (and kl): the trained tokens', over the epochs. Unknown is left out, not 0.
        if s_tokens:
            metrics["entropy"] = s_ent / s_tokens
        if tokens:
            metrics["entropy/trained"] = ent / tokens
        if beta > 0:
            metrics["kl"] = kl / max(tokens, 1.0)
        # TRL's names (it logs them with vLLM's correction): |log p_old - log p_sampler| over the first epoch's loss tokens,
        # and the correction's weights there
        metrics["sampling/sampling_logp_difference/mean"] = gap / tokens_first
        metrics["sampling/sampling_logp_difference/max"] = dist.max(host[12], what="metrics")
        if correction != "none":  # per token, or per completion (sequence_* modes)
            metrics["sampling/importance_sampling_ratio/mean"] = isw / max(is_count, 1.0)
            metrics["sampling/importance_sampling_ratio/min"] = _finite_or_zero(dist.min(host[13], what="metrics"))
            metrics["sampling/importance_sampling_ratio/max"] = _finite_or_zero(dist.max(host[14], what="metrics"))
        return metrics


def _finite_or_zero(x: float) -> float:
    """min/max over no micro-batch that could clip (mu = 1): nothing clipped, 0."""
    return x if math.isfinite(x) else 0.0
