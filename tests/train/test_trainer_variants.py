"""The GRPO variants end to end through `Trainer`: micro-batching, mu passes, KL reference,
dynamic sampling, truncated masking and high-entropy token selection.

Every test uses the session's tiny random model (conftest's `make_trainer`: G=4 completions
of 4 prompts, 4 new tokens, 3 steps) and scripted reward functions written to tmp_path, so
which groups carry signal is known in advance.
"""

import textwrap

import pytest
import torch

from rlvr import algo

G, PROMPTS = 4, 4  # make_trainer's rollout.group_size and rollout.prompts_per_step

# Rewards that differ between random completions: a checksum of the text, in [0, 1).
CHECKSUM = """
def checksum(prompts, completions, **kw):
    return [(sum(map(ord, c[0]["content"])) % 7) / 7 for c in completions]
"""

# Dynamic sampling script: prompts with an even answer get one reward for all G completions (no
# signal); the others get 0, 1/G, 2/G, ... by position in their group (signal).
PARITY = """
def parity(prompts, completions, answer, **kw):
    G = {G}
    return [0.5 if int(answer[i]) % 2 == 0 else (i % G) / G for i in range(len(completions))]
""".format(G=G)

CONSTANT = """
def constant(prompts, completions, **kw):
    return [1.0] * len(completions)
"""


def reward_file(tmp_path, source, name):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return f"rewards.0.fn={path}:{name}"


class Spy:
    """Wraps algo.policy_loss and records what the trainer hands it."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = algo.policy_loss

        def wrapper(logp, old_logp, advantages, mask, norms, **kw):
            self.calls.append(
                dict(
                    logp=logp.detach().clone(), old=old_logp.detach().clone(), mask=mask.clone(), norms=norms, adv=advantages.clone(), **kw
                )
            )
            return real(logp, old_logp, advantages, mask, norms, **kw)

        monkeypatch.setattr(algo, "policy_loss", wrapper)


def advantages_of(t, batch):
    """The step's advantages, as Trainer.train_step computes them."""
    a = t.cfg.algo
    return algo.combine_rewards(
        batch.rewards, batch.reward_weights, batch.episodes.group_size, mode=a.reward_aggregation, scale=a.scale_rewards, ddof=a.std_ddof
    )


# ---------------------------------------------------------------------------------------------
# gradient accumulation


def test_micro_batches_give_the_full_batch_update(make_trainer, tmp_path):
    """One pass over uneven micro-batches (5+5+5+1) gives the full batch's loss and gradients, on
    every pass of mu=2 (the second with ratios away from 1), with clip-higher and a KL term."""
    results = {}
    for mbs in (0, 5):
        t = make_trainer(
            reward_file(tmp_path, CHECKSUM, "checksum"),
            f"optim.micro_batch_size={mbs}",
            "optim.max_grad_norm=0",
            "optim.lr=0.05",
            "algo.num_iterations=2",
            "algo.epsilon_high=0.28",
            "algo.beta=0.04",
            # the plain forward: shared-prefix gradients agree only to ~1e-7 relative even in
            # float64 (tests/train/test_fastpaths.py checks them at fp32 tolerance)
            "optim.shared_prefix=false",
            run=f"mb{mbs}",
        )
        t.model.double()  # float64 so that the comparison can be tight
        t.ref_model.double()
        batch = t.collector.collect(t.state)
        adv = advantages_of(t, batch)
        assert adv.abs().max() > 0
        result = t.updater(batch.episodes, adv)
        results[mbs] = (
            [p.grad.clone() for p in t.model.parameters()],
            [p.detach().clone() for p in t.model.parameters()],
            result.metrics,
            result.micro_batch_sizes,
        )
    (g0, p0, m0, n0), (g1, p1, m1, n1) = results[0], results[5]
    assert (n0, n1) == ([16], [5, 5, 5, 1])
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-9, abs=1e-12)
    assert m1["kl"] == pytest.approx(m0["kl"], rel=1e-9, abs=1e-12)
    assert m0["clip_ratio/region_mean"] > 0  # the second pass did clip something
    for a, b in zip(g0, g1):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-11)
    for a, b in zip(p0, p1):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-11)


# ---------------------------------------------------------------------------------------------
# mu passes


def test_mu_passes_reuse_the_sampling_policy_log_probs_and_start_at_ratio_one(make_trainer, tmp_path, monkeypatch):
    spy = Spy(monkeypatch)
    t = make_trainer(reward_file(tmp_path, CHECKSUM, "checksum"), "algo.num_iterations=3", "optim.micro_batch_size=8", "optim.lr=0.05")
    t.train_step()
    assert len(spy.calls) == 3 * 2  # mu passes x micro-batches
    first, later = spy.calls[:2], spy.calls[2:]
    for c in first:
        assert torch.equal(c["logp"], c["old"])  # ratio exactly 1 on the first pass
    for j, c in enumerate(later):
        ref = first[j % 2]
        assert torch.equal(c["old"], ref["old"])  # the same old log-probs on every pass...
        assert torch.equal(c["old"], ref["logp"])  # ...namely the generating policy's
        assert not torch.equal(c["logp"], c["old"])  # while the policy has moved


# ---------------------------------------------------------------------------------------------
# KL and the reference model


def test_beta_loads_a_frozen_reference_and_kl_grows_from_zero(make_trainer, tmp_path):
    t = make_trainer(reward_file(tmp_path, CHECKSUM, "checksum"), "algo.beta=0.04", "optim.lr=0.05", "steps=3")
    assert t.ref_model is not None and t.ref_model is not t.model
    start = [p.detach().clone() for p in t.ref_model.parameters()]
    assert all(not p.requires_grad for p in t.ref_model.parameters())
    kls = [t.train_step()["kl"] for _ in range(3)]
    assert kls[0] == pytest.approx(0.0, abs=1e-9)  # policy == reference before the first update
    assert 0 < kls[1] < kls[2]
    for a, b in zip(start, t.ref_model.parameters()):
        assert torch.equal(a, b)  # the reference never moves
    moved = any(not torch.equal(a, b) for a, b in zip(start, t.model.parameters()))
    assert moved


def test_beta_zero_creates_no_reference_model(make_trainer):
    t = make_trainer()
    assert t.ref_model is None and t.policy.ref_model is None
    holders = (t, t.engine, t.policy, t.updater, t.source)
    modules = [v for obj in holders for v in vars(obj).values() if isinstance(v, torch.nn.Module)]
    assert modules and all(m is t.model for m in modules)  # no second copy of the weights anywhere
    assert "kl" not in t.train_step()


# ---------------------------------------------------------------------------------------------
# dynamic sampling


def _expected_dynamic(t, start, want, max_rounds):
    """Replay dynamic sampling on the stream by hand: which rows are kept, rounds, prompts consumed."""
    pos, kept, rounds = start, [], 0
    while True:
        need = want - len(kept)
        rows = [t.task.train_row(p) for p in range(pos, pos + need)]
        pos += need
        rounds += 1
        kept += [r for r in rows if int(r["answer"]) % 2 == 1]
        if len(kept) == want or rounds > max_rounds:
            return kept, rounds, pos - start, pos


def test_dynamic_sampling_refills_the_batch_with_groups_that_have_signal(make_trainer, tmp_path):
    over = [reward_file(tmp_path, PARITY, "parity"), "algo.dynamic_sampling=true", "algo.max_resample_rounds=8", "save_every=0"]
    t = make_trainer(*over)
    position = 0
    saw_resampling = False
    for step in range(2):
        kept, rounds, consumed, position = _expected_dynamic(t, position, PROMPTS, 8)
        m = t.train_step()
        batch, adv = t.last_step.batch, t.last_step.advantages
        assert [r["prompt"] for r in batch.rows] == [r["prompt"] for r in kept]
        assert (m["sampling/rounds"], m["sampling/prompts_consumed"], m["sampling/groups_kept"]) == (rounds, consumed, PROMPTS)
        assert t.stream.position == position  # exactly the prompts drawn, no more
        assert m["sampling/kept_frac_reward_zero_std"] == 0.0  # the trained batch; frac_reward_zero_std counts every round
        assert len(batch.episodes) == PROMPTS * G and (adv.view(-1, G).abs().amax(-1) > 0).all()
        saw_resampling |= rounds > 1
        if step == 0:
            ckpt = t.save_checkpoint()
    assert saw_resampling, "the script should have made at least one step resample"

    # resume from after step 1: the stream continues at the same position and step 2 is replayed exactly
    step2_batch = t.last_step.batch
    r = make_trainer(*over, f"resume={ckpt}")
    assert r.stream.position == _expected_dynamic(t, 0, PROMPTS, 8)[3]
    m = r.train_step()
    assert r.stream.position == t.stream.position
    assert [x["prompt"] for x in r.last_step.batch.rows] == [x["prompt"] for x in step2_batch.rows]
    assert torch.equal(r.last_step.batch.episodes.completion_ids, step2_batch.episodes.completion_ids)
    assert m["sampling/prompts_consumed"] == consumed


def test_dynamic_sampling_stops_after_max_resample_rounds(make_trainer, tmp_path):
    t = make_trainer(reward_file(tmp_path, CONSTANT, "constant"), "algo.dynamic_sampling=true", "algo.max_resample_rounds=2")
    m = t.train_step()
    assert m["sampling/rounds"] == 3  # the first round + 2 resample rounds
    assert m["sampling/prompts_consumed"] == 3 * PROMPTS == t.stream.position
    assert m["frac_reward_zero_std"] == 1.0 and m["loss"] == 0.0  # trained on the last round: no signal, no update


def test_dynamic_sampling_off_logs_no_sampling_metrics(make_trainer, tmp_path):
    t = make_trainer(reward_file(tmp_path, PARITY, "parity"))
    m = t.train_step()
    assert "sampling/rounds" not in m and t.stream.position == PROMPTS


# ---------------------------------------------------------------------------------------------
# truncated completions and high-entropy tokens


def test_truncated_completions_are_masked_out_of_the_loss(make_trainer, tmp_path, monkeypatch):
    spy = Spy(monkeypatch)
    t = make_trainer(
        reward_file(tmp_path, CHECKSUM, "checksum"),
        "algo.mask_truncated_completions=true",
        "rollout.max_new_tokens=2",
        "optim.skip_zero_advantage=false",
    )  # every row reaches the loss, so the mask can be checked row by row
    t.train_step()
    episodes = t.last_step.batch.episodes
    trunc = episodes.truncated
    assert trunc.any()
    (call,) = spy.calls
    assert torch.all(call["mask"][trunc] == 0)
    kept = episodes.loss_mask[~trunc]
    assert torch.equal(call["mask"][~trunc], kept[:, : call["mask"].shape[1]].float())
    assert call["norms"].num_tokens == int(kept.sum())  # the dapo normaliser counts kept tokens only


def test_high_entropy_selection_is_made_over_the_whole_batch(make_trainer, tmp_path, monkeypatch):
    selections = {}
    for mbs in (0, 5):
        spy = Spy(monkeypatch)
        t = make_trainer(
            reward_file(tmp_path, CHECKSUM, "checksum"), "algo.top_entropy_quantile=0.2", f"optim.micro_batch_size={mbs}", run=f"e{mbs}"
        )
        t.train_step()
        C = t.last_step.batch.episodes.completion_ids.shape[1]
        rows = [torch.nn.functional.pad(c["token_weights"], (0, C - c["token_weights"].shape[1])) for c in spy.calls]
        selections[mbs] = torch.cat(rows)
        assert len(t.last_step.micro_batch_sizes) == (1 if mbs == 0 else 4)
        monkeypatch.undo()
    assert torch.equal(selections[0], selections[5])
    n_tokens = int(t.last_step.batch.episodes.loss_mask.sum())
    assert 0 < selections[0].sum() <= 0.2 * n_tokens + 1
