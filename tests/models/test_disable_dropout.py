"""model.disable_dropout (TRL's disable_dropout): a model whose config asks for dropout, with LoRA adapters that do
too, trains without any: the training-mode forward is deterministic and equals the eval-mode one, in the policy and
its reference."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoConfig

from rlvr.config import ModelConfig
from rlvr.models.forward import uses_dropout
from rlvr.models.policy import load_policy


@pytest.fixture
def dropout_model(tiny_model_dir, tmp_path):
    path = tmp_path / "dropout_model"
    shutil.copytree(tiny_model_dir, path)
    config = AutoConfig.from_pretrained(path)
    config.attention_dropout = 0.3
    config.save_pretrained(path)
    return str(path)


def forwards(model, ids):
    model.train()
    one, two = (model(ids).logits for _ in range(2))
    model.eval()
    return one, two, model(ids).logits


@pytest.mark.parametrize("lora", [0, 4])
def test_disable_dropout_turns_every_dropout_off(dropout_model, lora):
    ids = torch.randint(8, 60, (2, 12), generator=torch.Generator().manual_seed(0))
    cfg = ModelConfig(path=dropout_model)
    cfg.lora.r, cfg.lora.dropout = lora, 0.2
    torch.manual_seed(0)
    live = load_policy(cfg, torch.device("cpu"), beta=0.04)
    model = live.peft or live.model
    assert uses_dropout(model)
    one, two, _ = forwards(model, ids)
    assert not torch.equal(one, two)  # the config's (and the adapters') dropout is live in training mode
    cfg.disable_dropout = True
    policy = load_policy(cfg, torch.device("cpu"), beta=0.04)
    model = policy.peft or policy.model
    assert not uses_dropout(model)
    one, two, plain = forwards(model, ids)
    assert torch.equal(one, two) and torch.equal(one, plain)
    if policy.ref_model is not None:  # full fine-tuning: a copy made after dropout went off
        assert not uses_dropout(policy.ref_model)
