"""Clip-Cov and KL-Cov (algo.clip_cov_ratio, algo.kl_cov_ratio) in a real run: they change the update as their
formulas say, and the tokens they pick do not depend on how the minibatch is cut into micro-batches."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

BASE = [
    "model.path=tiny",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=8",
    "eval_before_after=false",
    "optim.lr=1e-3",
    "log_completions_every=0",
    "steps=2",
]


def _metrics(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(run):
    return load_file(str(run / "final" / "model.safetensors"))


def _token_weights_of_one_step(make_trainer, monkeypatch, *overrides, run):
    """The token weights every policy_loss call of one step got, as one [N, C] tensor in row order."""
    from rlvr import algo

    calls, real = [], algo.policy_loss

    def spy(*args, **kwargs):
        calls.append(kwargs["token_weights"])
        return real(*args, **kwargs)

    monkeypatch.setattr(algo, "policy_loss", spy)
    t = make_trainer(*BASE, *overrides, run=run)
    t.train_step()
    monkeypatch.undo()
    C = t.last_step.batch.episodes.completion_ids.shape[1]
    return torch.cat([torch.nn.functional.pad(w, (0, C - w.shape[1]), value=1.0) for w in calls]), t


def test_clip_cov_detaches_a_share_of_the_tokens_chosen_over_the_whole_minibatch(make_trainer, tmp_path, monkeypatch):
    wide = ["algo.clip_cov_ratio=0.5", "algo.clip_cov_lb=-1e9", "algo.clip_cov_ub=1e9"]  # any covariance: half of all tokens
    whole, t = _token_weights_of_one_step(make_trainer, monkeypatch, *wide, "optim.micro_batch_size=16", run="whole")
    cut, t2 = _token_weights_of_one_step(make_trainer, monkeypatch, *wide, "optim.micro_batch_size=4", run="cut")
    trained = t.last_step.advantages != 0  # the zero-advantage skip (the default) trains only these rows
    assert t2.last_step.micro_batch_sizes == [4] * (int(trained.sum()) // 4) and len(t.last_step.micro_batch_sizes) == 1
    assert torch.equal(whole, cut)  # the same tokens, however the minibatch is cut
    assert t.plan.skip_zero_advantage and int(trained.sum()) == len(whole)
    tokens = int(t.last_step.batch.episodes.loss_mask[trained].sum())
    assert int((whole == 0).sum()) == int(0.5 * tokens)  # every token eligible: exactly the share of the rows trained


def test_clip_cov_keeps_the_skip_and_draws_over_the_rows_with_a_signal(make_trainer, tmp_path, monkeypatch):
    """A zero-advantage row has no gradient to detach, so Clip-Cov keeps the zero-advantage skip and its share is of
    the rows that carry a signal (verl's DAPO recipe drops those groups first); without the skip, of every row."""
    wide = ["algo.clip_cov_ratio=0.5", "algo.clip_cov_lb=-1e9", "algo.clip_cov_ub=1e9", "optim.micro_batch_size=16"]
    skip, t = _token_weights_of_one_step(make_trainer, monkeypatch, *wide, run="skip")
    every, t2 = _token_weights_of_one_step(make_trainer, monkeypatch, *wide, "optim.skip_zero_advantage=false", run="all")
    zero = t.last_step.advantages == 0
    assert 0 < int(zero.sum()) < len(zero)  # the step has both kinds of rows (the same rollout in both runs)
    assert torch.equal(t.last_step.advantages, t2.last_step.advantages)
    mask = t.last_step.batch.episodes.loss_mask
    assert (len(skip), len(every)) == (int((~zero).sum()), len(zero))
    assert int((skip == 0).sum()) == int(0.5 * int(mask[~zero].sum()))
    assert int((every == 0).sum()) == int(0.5 * int(mask.sum()))
    kl = make_trainer(*BASE, "algo.clip_cov_ratio=0", "algo.kl_cov_ratio=0.5", run="kl")
    assert not kl.plan.skip_zero_advantage  # KL-Cov's penalty has a gradient on zero-advantage rows


def test_kl_cov_adds_its_penalty_once_the_policy_moved(make_trainer, tmp_path):
    two = ["algo.num_iterations=2"]  # the second epoch's ratio is no longer 1: |log p_new - log p_old| > 0
    make_trainer(*BASE, *two, "algo.clip_cov_ratio=0", run="off").train()
    make_trainer(*BASE, *two, "algo.clip_cov_ratio=0", "algo.kl_cov_ratio=0.5", "algo.kl_cov_coef=10", run="on").train()
    off, on = _metrics(tmp_path / "off"), _metrics(tmp_path / "on")
    # step 1: the first epoch is identical (ratio 1, |log-ratio| = 0 with zero gradient); the second is not
    w_off, w_on = _weights(tmp_path / "off"), _weights(tmp_path / "on")
    assert any(not torch.equal(w_off[k], w_on[k]) for k in w_off)
    assert on[0]["loss"] > off[0]["loss"]  # the penalty is >= 0 and positive on the moved tokens (mean over the 2 updates)


def test_clip_cov_steps_when_no_row_carries_a_signal(make_trainer, tmp_path):
    """A reward that pays every completion the same: every advantage is 0 and the skip leaves no row (a collapsed run
    reaches this: tiny-tools at step 38). Clip-Cov then has nothing to draw from and the run is the defaults' run, to
    the bit."""
    (tmp_path / "same.py").write_text("def same(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    same = [f"rewards=[{tmp_path / 'same.py'}:same]"]
    off = make_trainer(*BASE, *same, "algo.clip_cov_ratio=0", run="off")
    off.train()
    on = make_trainer(*BASE, *same, "algo.clip_cov_ratio=0.02", run="on")
    on.train()
    assert bool((on.last_step.advantages == 0).all())
    w_off, w_on = _weights(tmp_path / "off"), _weights(tmp_path / "on")
    assert all(torch.equal(w_off[k], w_on[k]) for k in w_off)
    assert [m["loss"] for m in _metrics(tmp_path / "on")] == [m["loss"] for m in _metrics(tmp_path / "off")]


def test_clip_cov_takes_the_in_process_samplers_log_probs_instead_of_a_forward(make_trainer, monkeypatch):
    """On-policy, the hf engine's log-probs are the policy's (float32 tiny model: equal to ~1e-6), so Clip-Cov picks
    the same tokens from them as from a forward of its own, and the step runs no forward but the training one."""
    from rlvr.training.update import Updater

    forwards, real = [], Updater.fixed_forward

    def counted(self, *args, **kwargs):
        forwards.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Updater, "fixed_forward", counted)
    # the band (0, inf): tokens whose log p and advantage sit on the same side of their means, so log p picks them
    share = ["algo.clip_cov_ratio=0.5", "algo.clip_cov_lb=0", "algo.clip_cov_ub=1e9"]
    sampler, t = _token_weights_of_one_step(make_trainer, monkeypatch, *share, run="sampler")
    assert t.updater.sampler_is_policy and forwards == []

    monkeypatch.setattr(Updater, "fixed_forward", counted)
    monkeypatch.setattr(Updater, "__init__", _without_the_sampler(Updater.__init__))
    forward, t2 = _token_weights_of_one_step(make_trainer, monkeypatch, *share, run="forward")
    assert not t2.updater.sampler_is_policy and forwards == [1]
    assert torch.equal(t.last_step.advantages, t2.last_step.advantages)  # the same rollout
    trained = t.last_step.batch.episodes.loss_mask[t.last_step.advantages != 0]
    assert int((sampler == 0).sum()) == int(0.5 * int(trained.sum()))  # drawn at random among the band's tokens ...
    assert torch.equal(sampler, forward)  # ... the same draw from the same band


def _without_the_sampler(init):
    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.sampler_is_policy = False

    return patched
