"""A TRL script's learning-rate schedule is transformers' own, update for update: each lr_scheduler_type rlvr maps
(with its lr_scheduler_kwargs and warm-up) against transformers.get_scheduler over a whole run."""

from __future__ import annotations

import pytest
import torch
from transformers import get_scheduler

from rlvr.api.trl_config import GRPOConfig
from rlvr.api.trl_mapping import settings
from rlvr.config import ConfigError, load_config
from rlvr.training.setup import make_optimizer


def rates_of(cfg, steps: int) -> list[float]:
    """The rate each optimizer update of an rlvr run with `cfg` uses (its own optimizer and scheduler)."""
    optimizer, scheduler = make_optimizer(torch.nn.Linear(2, 2), cfg)
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


@pytest.mark.parametrize(
    "name, kwargs, warmup",
    [
        ("linear", {}, 5),
        ("linear", {}, 0),
        ("cosine", {}, 4),
        ("cosine", {"num_cycles": 0.5}, 3),
        ("cosine_with_min_lr", {"min_lr_rate": 0.1}, 6),
        ("cosine_with_min_lr", {"min_lr": 2e-5}, 0),
        ("constant_with_warmup", {}, 7),
        ("constant", {}, 0),
    ],
)
def test_each_schedule_is_transformers_update_for_update(name, kwargs, warmup):
    lr, total = 1e-4, 40
    args = GRPOConfig(
        output_dir="x", learning_rate=lr, lr_scheduler_type=name, lr_scheduler_kwargs=kwargs, warmup_steps=warmup, max_steps=total
    )
    fields, _ = settings(args, world_size=1, rows=800, has_eval=False, has_tools=False)
    cfg = load_config(None, [f"{k}={v}" for k, v in fields.items() if k.startswith("optim.")] + [f"steps={total}"])
    assert cfg.steps * cfg.optim.steps_per_generation * cfg.algo.num_iterations == total
    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=lr)
    reference = get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=total, scheduler_specific_kwargs=kwargs)
    expected = []
    for _ in range(total):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        reference.step()
    assert rates_of(cfg, total) == pytest.approx(expected, rel=1e-12, abs=1e-18)


def test_schedule_arguments_rlvr_does_not_take_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"lr_scheduler_kwargs=\{'num_cycles': 2\}: rlvr's schedules take min_lr_rate"):
        settings(
            GRPOConfig(output_dir="x", lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 2}),
            world_size=1,
            rows=80,
            has_eval=False,
            has_tools=False,
        )
    with pytest.raises(ConfigError, match=r"cosine_with_min_lr takes one of min_lr_rate or min_lr"):
        settings(GRPOConfig(output_dir="x", lr_scheduler_type="cosine_with_min_lr"), world_size=1, rows=80, has_eval=False, has_tools=False)


def test_rlvrs_own_warmup_wastes_no_update_and_the_cosine_floor_holds():
    cfg = load_config(None, ["steps=10", "optim.lr=1e-3", "optim.warmup_steps=4", "optim.lr_schedule=cosine", "optim.min_lr_rate=0.2"])
    rates = rates_of(cfg, 11)
    assert rates[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3], rel=1e-12)  # update u at (u + 1) / warmup
    assert rates[4] == pytest.approx(1e-3, rel=1e-12) and rates[10] == pytest.approx(2e-4, rel=1e-12)  # down to 0.2 x lr
    assert all(a >= b for a, b in zip(rates[3:], rates[4:]))
