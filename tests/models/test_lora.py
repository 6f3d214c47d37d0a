"""LoRA through peft: only adapter weights train, the KL reference is the base with the adapter
disabled (one copy of the base weights), the adapter is saved (and merged weights on request),
resume restores it, and gradient checkpointing changes memory, not the math."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from _paths import REPO

pytest.importorskip("peft")


@pytest.fixture
def make(make_trainer, tmp_path):
    """conftest's make_trainer on the dense partial-credit reward (every group has signal), 6 new tokens, 2 steps."""
    from _runs import DENSE_REWARD

    (tmp_path / "dense.py").write_text(DENSE_REWARD)
    base = ["rollout.max_new_tokens=6", "optim.lr=0.01", "steps=2", "doctor_every=0", f"rewards.0.fn={tmp_path / 'dense.py'}:digit_share"]
    return lambda *extra, **kw: make_trainer(*base, *extra, **kw)


def _storages(module) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in module.parameters()}


def test_lora_trains_only_adapters_and_reference_is_the_same_weights(make, tmp_path):
    t = make("model.lora.r=4", "algo.beta=0.1", "model.lora.save_merged=true")
    trainable = {n for n, p in t.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert t.ref_model is None  # no frozen copy
    base_params = {id(p) for n, p in t.model.named_parameters() if "lora_" not in n}
    assert len(_storages(t.model)) == len({p.untyped_storage().data_ptr() for p in t.model.parameters()})
    n_storages_before = len(_storages(t.model))
    frozen = {n: p.detach().clone() for n, p in t.model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
    summary = t.train()
    # Every parameter tensor of the process: the model's own, nothing else was allocated.
    assert len(_storages(t.model)) == n_storages_before
    assert {id(p) for n, p in t.model.named_parameters() if "lora_" not in n} == base_params
    for n, p in t.model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n
    assert any(not torch.equal(p, adapters[n]) for n, p in t.model.named_parameters() if n in adapters)
    # The KL is computed against the base: nonzero once the adapter has moved.
    m = t.train_step()
    assert m["kl"] > 0
    final = tmp_path / "run" / "final"
    assert (final / "adapter_model.safetensors").exists() and (final / "adapter_config.json").exists()
    assert not (final / "model.safetensors").exists()
    merged = tmp_path / "run" / "final-merged"
    from transformers import AutoModelForCausalLM

    m2 = AutoModelForCausalLM.from_pretrained(merged)
    assert not any("lora_" in n for n, _ in m2.named_parameters())
    assert summary["output_dir"]


def test_lora_reference_equals_base_model(make, tiny_model_dir):
    t = make("model.lora.r=4", "algo.beta=0.1")
    with torch.no_grad():
        for p in (p for n, p in t.model.named_parameters() if "lora_B" in n):
            p.add_(0.5)  # move the adapter away from zero
    e = t.collector.collect(t.state).episodes
    size = t.plan.micro_batch_size
    mbs = [slice(i, min(i + size, len(e))) for i in range(0, len(e), size)]
    ref = t.updater.reference_logprobs(e, mbs)
    pol = t.updater.fixed_logprobs(t.model, e, mbs)
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    want = t.updater.fixed_logprobs(base, e, mbs)
    mask = e.loss_mask.bool()
    assert torch.allclose(ref[mask], want[mask], atol=1e-5)
    assert not torch.allclose(pol[mask], want[mask], atol=1e-3)


def test_lora_checkpoint_resume(make):
    t = make("model.lora.r=4", "save_every=1", "steps=3")
    t.train_step()
    path = t.save_checkpoint()
    assert (path / "adapter_model.safetensors").exists()
    want = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
    t2 = make("model.lora.r=4", "save_every=1", "steps=3", "resume=auto")
    assert t2.state.step == 1 and t2.resumed_from == path
    for n, p in t2.model.named_parameters():
        if n in want:
            assert torch.equal(p, want[n]), n


def test_gradient_checkpointing_same_update(make, monkeypatch):
    from rlvr.models import attention

    # checkpointing keeps SDPA (rlvr.models.attention.short_attention_explicit: no explicit products, no C kernel) and
    # transformers' RMSNorm and rotary backward (rlvr.models.norm_rotary; Adam's first step turns their 1e-7 rounding
    # into 1e-5 on tiny gradients): compare like with like
    monkeypatch.setattr(attention, "EXPLICIT_MAX", {k: attention.Bounds(0, 0) for k in attention.EXPLICIT_MAX})
    monkeypatch.setattr("rlvr.models.native_causal_attention.ON", False)
    monkeypatch.setattr("rlvr.models.forward.fused_norm_and_rotary", lambda model: contextlib.nullcontext())

    def run(*extra):
        torch.manual_seed(0)
        t = make(*extra)
        m = t.train_step()
        return m["loss"], {n: p.detach().clone() for n, p in t.model.named_parameters()}

    # the prompt-once forward is off under checkpointing (no KV cache in training): compare like with like
    l1, w1 = run("optim.shared_prefix=false")
    l2, w2 = run("optim.shared_prefix=false", "model.gradient_checkpointing=true")
    assert abs(l1 - l2) < 1e-6
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-6


def test_lora_peak_rss_below_full_finetune(tmp_path):
    """Fast version of bench/lora_memory.py on a small model (the 25M numbers are in bench/results)."""
    import subprocess
    import sys

    bench = REPO / "bench" / "lora_memory.py"
    out = subprocess.run([sys.executable, str(bench), "--small", "--json"], capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["lora"]["peak_rss_mb"] < res["full"]["peak_rss_mb"], res
    assert res["lora"]["trainable_m"] < 0.1 * res["full"]["trainable_m"]
