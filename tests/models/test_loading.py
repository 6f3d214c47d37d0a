"""load_model on the CPU: transformers' Hub kernelization is off (nothing of it runs on the CPU, and it would run
again at every train()/eval() switch), and the model computes what transformers' default load computes."""

import torch
from _paths import REPO
from transformers import AutoModelForCausalLM

from rlvr.models.loading import load_model

TINY = str(REPO / "src" / "rlvr" / "models" / "tiny")


def test_cpu_model_is_not_kernelized_at_mode_switches():
    model = load_model(TINY)
    assert not getattr(model, "use_kernels", False)

    def kernelize(*args, **kwargs):
        raise AssertionError("a train()/eval() switch kernelized the model")

    model.set_use_kernels = kernelize
    model.eval()
    model.train()
    default = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, default(ids).logits)
