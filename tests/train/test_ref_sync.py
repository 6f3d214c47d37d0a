"""algo.ref_sync_steps / ref_sync_alpha (TR-DPO's soft reference update, TRL's sync_ref_model): the frozen reference
moves toward the policy every N optimizer steps, by TRL's own arithmetic; the KL then measures against the moved
reference; checkpoints keep it, so a resumed run continues with it bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from rlvr.config import ConfigError, load_config
from rlvr.training.setup import check_config

SYNC = [
    "model.path=tiny",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=8",
    "eval_before_after=false",
    "optim.lr=1e-2",  # large steps: the policy moves visibly from the reference in one step
    "log_completions_every=0",
    "report_to=[]",
    "model.autocast=none",
    "algo.beta=0.1",
]


def trl_sync_target_model(model, target_model, alpha):
    """TRL 1.16.0's SyncRefModelCallback._sync_target_model, transcribed."""
    for target_param, copy_param in zip(target_model.parameters(), model.parameters(), strict=True):
        target_param.data.mul_(1.0 - alpha).add_(copy_param.data, alpha=alpha)


def weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("every, moves_at", [(1, [1, 2]), (2, [2])])
def test_the_reference_mixes_in_the_policy_every_n_optimizer_steps_as_trls_callback(make_trainer, every, moves_at):
    t = make_trainer(*SYNC, f"algo.ref_sync_steps={every}", "algo.ref_sync_alpha=0.25")
    expected = weights(t.policy.ref_model)  # the initial policy
    assert all(torch.equal(a, b) for a, b in zip(expected, weights(t.model)))
    for step in (1, 2):
        t.train_step()  # one optimizer step each (steps_per_generation = num_iterations = 1)
        if step in moves_at:
            mirror = type(t.model)(t.model.config)
            with torch.no_grad():
                for p, w in zip(mirror.parameters(), expected):
                    p.copy_(w)
            trl_sync_target_model(t.model, mirror, 0.25)
            expected = weights(mirror)
        got = weights(t.policy.ref_model)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), f"step {step}"
        assert not all(torch.equal(a, b) for a, b in zip(got, weights(t.model)))  # alpha < 1: between the two


def test_with_alpha_one_the_kl_is_measured_against_the_last_policy(make_trainer):
    """alpha = 1 copies the policy into the reference after each optimizer step: the next step's on-policy KL is 0
    (the policy's and the reference's log-probs are the same weights'); without the sync it is not."""
    synced = make_trainer(*SYNC, "algo.ref_sync_steps=1", "algo.ref_sync_alpha=1.0", run="synced")
    plain = make_trainer(*SYNC, run="plain")
    kls = [[t.train_step()["kl"] for _ in range(2)] for t in (synced, plain)]
    assert kls[0][0] == kls[1][0] == 0.0  # the first step: policy and reference are the initial weights
    assert abs(kls[0][1]) < 1e-7 and kls[1][1] > 1e-4


def test_a_resumed_run_continues_with_the_moved_reference(make_trainer, tmp_path):
    common = (*SYNC, "algo.ref_sync_steps=1", "algo.ref_sync_alpha=0.5", "steps=3")
    make_trainer(*common, run="straight").train()
    first = make_trainer(*common, run="resumed")
    for _ in range(2):
        first.train_step()
    saved = first.save_checkpoint()
    moved = weights(first.policy.ref_model)
    del first
    assert (saved / "reference" / "model.safetensors").exists()
    assert sorted(p.name for p in saved.glob("*.safetensors")) == ["model.safetensors"]  # the policy's weights alone
    again = make_trainer(*common, "resume=auto", run="resumed")
    assert all(torch.equal(a, b) for a, b in zip(weights(again.policy.ref_model), moved))
    again.train()
    rows = [[json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()] for run in ("straight", "resumed")]
    assert rows[0][2]["kl"] == rows[1][-1]["kl"] and rows[0][2]["loss"] == rows[1][-1]["loss"]
    w1, w2 = (load_file(str(tmp_path / run / "final" / "model.safetensors")) for run in ("straight", "resumed"))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_settings_that_cannot_sync_are_refused_and_unused_ones_noted():
    with pytest.raises(ConfigError, match=r"with LoRA \(model.lora.r > 0\) the reference is the base model"):
        check_config(load_config(None, ["algo.beta=0.1", "algo.ref_sync_steps=4", "model.lora.r=4"]))
    with pytest.raises(ConfigError, match=r"`algo.ref_sync_alpha` must be in \(0, 1\], got 0.0"):
        check_config(load_config(None, ["algo.beta=0.1", "algo.ref_sync_steps=4", "algo.ref_sync_alpha=0"]))
    with pytest.raises(ConfigError, match=r"`algo.ref_sync_steps` must be >= 0"):
        check_config(load_config(None, ["algo.beta=0.1", "algo.ref_sync_steps=-1"]))
    with pytest.raises(ConfigError, match=r"not implemented with dist.strategy=fsdp"):
        check_config(load_config(None, ["algo.beta=0.1", "algo.ref_sync_steps=4", "nproc=2", "dist.strategy=fsdp"]))
    warnings = check_config(load_config(None, ["algo.ref_sync_steps=4"]))
    assert "algo.ref_sync_steps=4 has no effect: there is no KL term (algo.beta=0)" in warnings
    warnings = check_config(load_config(None, ["algo.beta=0.1", "algo.ref_sync_alpha=0.3"]))
    assert "algo.ref_sync_alpha=0.3 has no effect: algo.ref_sync_steps=0 keeps the reference at the initial policy" in warnings
