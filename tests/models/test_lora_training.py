"""peft LoRA Linears with the scaling on the adapter's rank-r side in the training forward (rlvr.models.lora_training):
peft's own bits for power-of-two scalings (fp32 through addmm, bf16 autocast through one add, adapter dropout on),
within fp32 rounding for others, and peft's forward wherever the swap does not apply."""

from __future__ import annotations

import contextlib

import pytest
import torch

from rlvr.models.forward import completion_logprobs
from rlvr.models.lora_training import lora_training_forward

pytest.importorskip("peft")
from _lora import adapted, tiny_lora  # noqa: E402

PROMPT = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]])
PROMPT_MASK = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
COMPLETION = torch.tensor([[20, 21, 22, 0], [23, 24, 25, 26], [27, 28, 0, 0]])
COMPLETION_MASK = (COMPLETION > 0).long()


def _loss_and_grads(model, swap: bool, autocast: bool = False, seed: int = 0):
    """A loss over the log-probs of a fixed batch (through the model's own forward: peft's, or swapped), its gradient
    for every trainable weight."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # adapter dropout draws the same masks both ways
    with lora_training_forward(model) if swap else contextlib.nullcontext(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        ids = torch.cat([PROMPT, COMPLETION], 1)
        attn = torch.cat([PROMPT_MASK, COMPLETION_MASK], 1)
        logits = model(input_ids=ids, attention_mask=attn).logits.float()  # [N, P + C, V]
    logp = logits.log_softmax(-1)[:, PROMPT.shape[1] - 1 : -1].gather(-1, COMPLETION[..., None]).squeeze(-1)
    loss = (logp * COMPLETION_MASK).sum() / COMPLETION_MASK.sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("r, alpha, dropout", [(4, 8, 0.0), (4, 4, 0.0), (8, 16, 0.3)])  # scaling 2, 1, 2
def test_power_of_two_scaling_gives_pefts_loss_and_gradients_bit_for_bit(tiny_model_dir, r, alpha, dropout):
    model = tiny_lora(tiny_model_dir, r, alpha, lora_dropout=dropout)
    model.train()  # the adapters' dropout live where it is > 0
    with lora_training_forward(model) as n:
        assert n == len(adapted(model)) > 0
    loss, grads = _loss_and_grads(model, swap=False)
    swapped_loss, swapped_grads = _loss_and_grads(model, swap=True)
    assert torch.equal(loss, swapped_loss)
    assert grads.keys() == swapped_grads.keys() and all(torch.equal(grads[k], swapped_grads[k]) for k in grads)


def test_bf16_autocast_and_adapter_dropout_give_pefts_bits(tiny_model_dir):
    model = tiny_lora(tiny_model_dir, 4, 8, lora_dropout=0.3)
    model.train()
    loss, grads = _loss_and_grads(model, swap=False, autocast=True, seed=3)
    swapped_loss, swapped_grads = _loss_and_grads(model, swap=True, autocast=True, seed=3)
    assert torch.equal(loss, swapped_loss)
    assert all(torch.equal(grads[k], swapped_grads[k]) for k in grads)
    other_loss, _ = _loss_and_grads(model, swap=True, autocast=True, seed=4)
    assert not torch.equal(other_loss, loss)  # the dropout is live: another seed, another loss


def test_other_scalings_agree_to_fp32_rounding(tiny_model_dir):
    model = tiny_lora(tiny_model_dir, 4, 6)  # scaling 1.5
    loss, grads = _loss_and_grads(model, swap=False)
    swapped_loss, swapped_grads = _loss_and_grads(model, swap=True)
    torch.testing.assert_close(swapped_loss, loss, rtol=1e-6, atol=0)
    for k in grads:
        torch.testing.assert_close(swapped_grads[k], grads[k], rtol=1e-5, atol=1e-6 * float(grads[k].abs().max()))


def test_the_training_forward_runs_it_with_and_without_gradients_and_nothing_else_does(tiny_model_dir):
    """completion_logprobs takes the swapped forward (lora_B's module is not called) with gradients and without (a
    step's old log-probs, by the same formula as the trained ones); after the block a model call runs peft's forward
    as before (it calls lora_B)."""
    model = tiny_lora(tiny_model_dir, 4, 6)
    calls: list[int] = []
    for m in adapted(model):
        m.lora_B["default"].register_forward_hook(lambda *a: calls.append(1))
    args = (PROMPT, PROMPT_MASK, COMPLETION, COMPLETION_MASK)
    with_grad = completion_logprobs(model, *args).logp
    with torch.no_grad():
        no_grad = completion_logprobs(model, *args).logp
    assert calls == [] and with_grad.requires_grad
    # with and without gradients the forwards round apart on a model without LoRA too (~1e-5 here)
    torch.testing.assert_close(with_grad.detach(), no_grad, rtol=0, atol=1e-4)
    assert all("forward" not in m.__dict__ for m in adapted(model))  # the class's forward again
    with torch.no_grad():
        model(input_ids=PROMPT)
    assert len(calls) == len(adapted(model))


def test_under_bf16_autocast_a_bf16_input_takes_it_too(tiny_model_dir):
    """down_proj's input is the MLP's bf16 product under autocast: with the adapters' dropout off it takes the swapped
    forward too (lora_B's module not called), where peft would cast it to fp32 and autocast back, with peft's bits."""
    model = tiny_lora(tiny_model_dir, 4, 8)
    loss, grads = _loss_and_grads(model, swap=False, autocast=True)
    swapped_loss, swapped_grads = _loss_and_grads(model, swap=True, autocast=True)
    assert torch.equal(loss, swapped_loss) and all(torch.equal(grads[k], swapped_grads[k]) for k in grads)
    calls: list[str] = []
    for name, m in model.named_modules():
        if hasattr(m, "lora_B") and hasattr(m, "base_layer"):
            m.lora_B["default"].register_forward_hook(lambda *a, name=name: calls.append(name))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        completion_logprobs(model, PROMPT, PROMPT_MASK, COMPLETION, COMPLETION_MASK)
        assert calls == []
        x = torch.randn(3, adapted(model)[0].in_features).bfloat16()
        with lora_training_forward(model):
            adapted(model)[0](x.half())  # fp16 under bf16 autocast: peft's forward
    assert len(calls) == 1


def test_dora_and_gradient_checkpointing_keep_pefts_forward(tiny_model_dir):
    dora = tiny_lora(tiny_model_dir, use_dora=True)
    with lora_training_forward(dora) as n:
        assert n == 0
    model = tiny_lora(tiny_model_dir)
    model.activation_checkpointing_enable()
    model.train()
    with lora_training_forward(model) as n:
        assert n == 0
