"""The trainer's optimizer (rlvr.training.setup.make_optimizer): torch's fused AdamW where the parameters are plain
ones on the CPU or CUDA (what transformers' Trainer, and so TRL, runs by default), the same update as torch's
per-tensor AdamW; parameters of a tensor subclass (FSDP2's sharded DTensors) keep torch's default implementation."""

import torch

from rlvr.config import load_config
from rlvr.training.setup import make_optimizer


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    model[0].bias.requires_grad_(False)  # frozen parameters stay out of the optimizer
    return model


def _steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 3) -> None:
    for i in range(steps):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()


def test_fused_adamw_takes_the_per_tensor_update():
    cfg = load_config(None, ["optim.lr=0.01", "optim.weight_decay=0.1", "optim.beta1=0.8", "optim.beta2=0.95"])
    fused_model, loop_model = _model(), _model()
    optimizer, _ = make_optimizer(fused_model, cfg)
    assert optimizer.defaults["fused"] is True
    assert [p for g in optimizer.param_groups for p in g["params"]] == [p for p in fused_model.parameters() if p.requires_grad]
    loop = torch.optim.AdamW(
        [p for p in loop_model.parameters() if p.requires_grad], lr=0.01, betas=(0.8, 0.95), weight_decay=0.1, foreach=False
    )
    _steps(fused_model, optimizer)
    _steps(loop_model, loop)
    for fused_p, loop_p in zip(fused_model.parameters(), loop_model.parameters()):
        torch.testing.assert_close(fused_p, loop_p, rtol=1e-6, atol=1e-7)
    assert not torch.equal(fused_model[0].weight, _model()[0].weight)  # the steps moved it


class _Subclass(torch.Tensor):
    pass


def test_parameters_of_a_tensor_subclass_keep_the_default_implementation():
    model = _model()
    model[2].weight = torch.nn.Parameter(model[2].weight.detach().as_subclass(_Subclass))
    assert type(model[2].weight) is _Subclass  # as FSDP2's DTensor parameters are
    optimizer, _ = make_optimizer(model, load_config(None, []))
    assert optimizer.defaults["fused"] is None
