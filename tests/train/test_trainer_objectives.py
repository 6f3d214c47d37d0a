"""TRL 1.16's loss types, the entropy bonus, OPSM, the KL bias correction and several optimizer steps
per generated batch (`optim.steps_per_generation`) end to end through `Trainer` on the session's tiny
random model (conftest's make_trainer: 4 prompts x G=4, 4 new tokens), and their config checks.
"""

import pytest
import torch

from rlvr import algo
from rlvr.config import ConfigError, load_config
from rlvr.models.forward import completion_logprobs, trim_padding
from rlvr.training.minibatches import Minibatch, minibatches
from rlvr.training.setup import check_config
from test_trainer_variants import CHECKSUM, CONSTANT, PARITY, advantages_of, reward_file


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _logprobs(model, e):
    p_ids, p_mask, c_ids, c_mask = trim_padding(e.prompt_ids, e.prompt_mask, e.completion_ids, e.attention_mask)
    return completion_logprobs(model, p_ids, p_mask, c_ids, c_mask).logp, c_ids.shape[1]


# ---------------------------------------------------------------------------------------------
# steps_per_generation


STEPS_OVERRIDES = [
    "optim.lr=0.05",
    "optim.max_grad_norm=0.5",
    "algo.num_iterations=2",
    "algo.epsilon_high=0.28",
    "rollout.prompts_per_step=6",
    "optim.shared_prefix=false",
]  # the plain forward: float64-tight gradients


def _float64_trainer(make_trainer, tmp_path, *overrides, run):
    t = make_trainer(reward_file(tmp_path, PARITY, "parity"), *STEPS_OVERRIDES, *overrides, run=run)  # some groups without signal
    t.model.double()
    return t


def test_steps_per_generation_equals_k_separate_optimizer_steps_on_the_minibatches(make_trainer, tmp_path):
    """k = 3 minibatches of 2 prompts, mu = 2: the update equals, to 1e-6 (float64: bitwise when written), 6
    optimizer steps written out here: for each pass, for each minibatch, its own loss (its own
    normalisers) against the generating policy's log-probs, its own gradient clipping, its own step.
    The trainer's fast paths (rows with advantage 0 skipped, micro-batches packed by length) run on
    its side; micro-batches of 2 give the same update (gradient accumulation inside each minibatch)."""
    t = _float64_trainer(make_trainer, tmp_path, "optim.steps_per_generation=3", run="k3")
    batch = t.collector.collect(t.state)
    adv = advantages_of(t, batch)
    pieces = minibatches(batch, adv, 3)
    assert [len(b.rows) for b, _ in pieces] == [2, 2, 2]
    assert (adv == 0).any() and adv.abs().max() > 0  # some rows are skipped, the others learn
    start = _params(t.model)
    result = t.updater.update([Minibatch(b.episodes, a) for b, a in pieces])
    assert not result.skipped and t.scheduler.last_epoch == 6
    ours = _params(t.model)

    # the reference: a fresh trainer (same start), k separate optimizer steps per pass, written out
    r = _float64_trainer(make_trainer, tmp_path, run="ref")
    for a, b in zip(start, r.model.parameters()):
        assert torch.equal(a, b)
    with torch.no_grad():
        old = [_logprobs(r.model, b.episodes)[0] for b, _ in pieces]  # the generating policy, before any step
    params = [p for p in r.model.parameters() if p.requires_grad]
    for _ in range(2):  # mu passes, each over every minibatch
        for (b, a), old_j in zip(pieces, old):
            r.optimizer.zero_grad(set_to_none=True)
            logp, C = _logprobs(r.model, b.episodes)
            mask = b.episodes.loss_mask[:, :C].double()
            norms = algo.BatchNorms(num_sequences=len(b.episodes), num_tokens=int(mask.sum()), max_completion_length=4)
            algo.policy_loss(logp, old_j[:, :C], a.float(), mask, norms, loss_type="dapo", epsilon=0.2, epsilon_high=0.28).loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            r.optimizer.step()
    for a, b in zip(ours, r.model.parameters()):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=1e-6)
    assert max((a - b).abs().max().item() for a, b in zip(ours, start)) > 1e-2  # the weights moved a lot

    # one step on the whole batch per pass is a different update
    one = _float64_trainer(make_trainer, tmp_path, run="k1")
    one.updater(batch.episodes, adv)
    assert max((a - b.detach()).abs().max().item() for a, b in zip(ours, one.model.parameters())) > 1e-3

    # gradient accumulation inside each minibatch: micro-batches of 2 rows, the same update
    mb = _float64_trainer(make_trainer, tmp_path, "optim.steps_per_generation=3", "optim.micro_batch_size=2", run="mb2")
    mb_result = mb.updater.update([Minibatch(b.episodes, a) for b, a in pieces])
    assert len(mb_result.micro_batch_sizes) > len(result.micro_batch_sizes)
    for a, b in zip(ours, mb.model.parameters()):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=1e-9)


def test_minibatches_are_whole_groups_in_order(make_trainer, tmp_path):
    t = make_trainer(reward_file(tmp_path, CHECKSUM, "checksum"), "rollout.prompts_per_step=5")
    batch = t.collector.collect(t.state)
    adv = advantages_of(t, batch)
    for k, sizes in [(1, [5]), (2, [2, 3]), (5, [1] * 5), (8, [1] * 5)]:  # 8 > 5 groups (dynamic sampling short): 5 steps
        pieces = minibatches(batch, adv, k)
        assert [len(b.rows) for b, _ in pieces] == sizes
        assert [r for b, _ in pieces for r in b.rows] == batch.rows
        assert torch.equal(torch.cat([b.episodes.group_ids for b, _ in pieces]), batch.episodes.group_ids)
        assert torch.equal(torch.cat([a for _, a in pieces]), adv)
        assert torch.equal(torch.cat([b.rewards for b, _ in pieces]), batch.rewards)
    assert minibatches(batch, adv, 1)[0][0] is batch  # k = 1: the batch itself, untouched


def test_steps_per_generation_through_train_step(make_trainer, tmp_path):
    t = make_trainer(
        reward_file(tmp_path, CHECKSUM, "checksum"),
        "optim.steps_per_generation=2",
        "algo.num_iterations=2",
        "optim.lr_schedule=linear",
        "steps=2",
    )
    assert "2 minibatches of 8 completions per rank" in t.plan.describe()
    m = t.train_step()
    assert t.scheduler.last_epoch == 4  # mu x k optimizer steps
    assert t.scheduler.get_last_lr()[0] == pytest.approx(3e-4 * (1 - 4 / 8))  # the schedule counts steps x mu x k
    assert torch.isfinite(torch.tensor(m["loss"]))


# ---------------------------------------------------------------------------------------------
# the loss types and features through the trainer


@pytest.mark.parametrize(
    "overrides",
    [
        ["algo.loss_type=cispo", "algo.epsilon_high=5.0"],
        ["algo.loss_type=sapo"],
        ["algo.loss_type=vespo"],
        ["algo.loss_type=luspo", "algo.importance_sampling_level=sequence"],
        ["algo.off_policy_mask_threshold=0.5", "algo.beta=0.04", "algo.kl_bias_correction=true"],
    ],
)
def test_each_loss_type_and_feature_trains(make_trainer, tmp_path, overrides):
    t = make_trainer(reward_file(tmp_path, CHECKSUM, "checksum"), "optim.lr=0.05", "algo.num_iterations=2", *overrides)
    start = _params(t.model)
    m = t.train_step()
    assert torch.isfinite(torch.tensor(m["loss"])) and m["skipped_steps"] == 0
    assert max((a - b).abs().max().item() for a, b in zip(start, t.model.parameters())) > 1e-4


def test_entropy_bonus_alone_raises_the_entropy(make_trainer, tmp_path):
    """Constant rewards: every advantage is 0 and the policy term has no gradient. With entropy_coef > 0
    the rows are no longer skipped (the bonus has a gradient there) and the update raises the entropy
    of the very completions it trained on; with entropy_coef = 0 the weights do not move at all."""
    moved = {}
    for coef in (0.0, 0.5):
        t = make_trainer(reward_file(tmp_path, CONSTANT, "constant"), f"algo.entropy_coef={coef}", "optim.lr=0.01", run=f"e{coef}")
        assert t.plan.skip_zero_advantage is (coef == 0)
        start = _params(t.model)
        t.train_step()
        e = t.last_step.batch.episodes
        mask = e.loss_mask.bool()

        def mean_entropy(t=t, e=e, mask=mask):
            return t.updater.fixed_logprobs(t.model, e, [slice(0, len(e))], entropy=True)[mask].mean().item()

        after = mean_entropy()
        moved[coef] = max((a - b).abs().max().item() for a, b in zip(start, t.model.parameters()))
        if coef:
            with torch.no_grad():
                for p, s in zip(t.model.parameters(), start):
                    p.copy_(s)
            assert after > mean_entropy() + 1e-4
    assert moved[0.0] == 0.0 and moved[0.5] > 1e-4


# ---------------------------------------------------------------------------------------------
# config checks


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.loss_type=cispo"], "algo.epsilon_high above 1, e.g. 5.0"),
        (["algo.loss_type=cispo", "algo.epsilon_high=0.28"], "caps the importance weight at algo.epsilon_high itself"),
        (["algo.loss_type=sapo", "algo.sapo_temperature_neg=0"], "`algo.sapo_temperature_neg` must be positive"),
        (["algo.vespo_k_pos=-1"], "`algo.vespo_k_pos` must be >= 0"),
        (["algo.off_policy_mask_threshold=-0.1"], "`algo.off_policy_mask_threshold` must be positive"),
        (["optim.steps_per_generation=0"], "`optim.steps_per_generation` must be >= 1"),
        (["rollout.prompts_per_step=6", "optim.steps_per_generation=4"], "steps_per_generation to one of [1, 2, 3, 6]"),
        (["algo.loss_type=cispco"], "did you mean 'cispo'"),
    ],
)
def test_bad_settings_are_named(overrides, message):
    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        check_config(load_config(None, overrides))


def test_trl_s_warnings_for_luspo_and_vespo_levels():
    assert any("luspo" in w for w in check_config(load_config(None, ["algo.loss_type=luspo"])))
    assert any("vespo" in w for w in check_config(load_config(None, ["algo.loss_type=vespo", "algo.importance_sampling_level=sequence"])))
    assert not any(
        "luspo" in w for w in check_config(load_config(None, ["algo.loss_type=luspo", "algo.importance_sampling_level=sequence"]))
    )
