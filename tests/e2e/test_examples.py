"""The ready configs in examples/ parse and validate, and the memory each states is what rlvr's
batch plan estimates for it. Their models are built on the meta device from the architectures
Qwen publishes (no weights, no hub): parameter and LoRA counts are the real ones."""

import re
from pathlib import Path

import pytest
import torch

from rlvr.config import load_config
from rlvr.training.batch_plan import GiB, BatchPlan
from rlvr.training.setup import check_config
from _paths import REPO

EXAMPLES = sorted((REPO / "examples").glob("gsm8k-*.yaml"))  # GPU configs
CPU_EXAMPLES = sorted(set((REPO / "examples").glob("*.yaml")) - set(EXAMPLES))
PROMPT_TOKENS = 256  # GSM8K question + system prompt, rounded up

# config.json of Qwen/Qwen2.5-{0.5B,1.5B}-Instruct (the fields that set the parameter count)
QWEN = {
    "Qwen/Qwen2.5-0.5B-Instruct": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
}
PARAMS = {"Qwen/Qwen2.5-0.5B-Instruct": 494_032_768, "Qwen/Qwen2.5-1.5B-Instruct": 1_543_714_304}


def meta_model(cfg):
    from transformers import AutoModelForCausalLM, Qwen2Config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**QWEN[cfg.model.path]), dtype=getattr(torch, cfg.model.dtype))
    assert sum(p.numel() for p in model.parameters()) == PARAMS[cfg.model.path]
    lo = cfg.model.lora
    if lo.r:
        import peft

        targets = "all-linear" if lo.target_modules == ["all-linear"] else lo.target_modules
        model = peft.get_peft_model(model, peft.LoraConfig(r=lo.r, lora_alpha=lo.alpha, target_modules=targets, task_type="CAUSAL_LM"))
    return model


def estimate(cfg) -> dict[str, float]:
    """GiB per GPU: the trainer's share (batch plan) and vLLM's reserved share."""
    plan = BatchPlan.build(cfg, cfg.nproc, meta_model(cfg), prompt_tokens=PROMPT_TOKENS)
    mem = {k: v / GiB for k, v in plan.memory().items()}
    mem["trainer"] = sum(mem.values())
    return mem


def stated(path: Path) -> dict[str, float]:
    header = path.read_text().split("\n\n", 1)[0]
    m = re.search(
        r"trainer ~([\d.]+) GiB per GPU \(weights ([\d.]+), gradients ([\d.]+), optimizer ([\d.]+), activations ([\d.]+)\)", header
    )
    assert m, f"{path.name}: the header must state the memory"
    gpu = re.search(r"needs a GPU with >= (\d+) GiB", header)
    assert gpu, f"{path.name}: the header must state the GPU size it needs"
    keys = ("trainer", "weights", "gradients", "optimizer", "activations")
    return {**dict(zip(keys, map(float, m.groups()))), "gpu": float(gpu.group(1))}


def test_there_are_examples_for_each_setting():
    names = [p.name for p in EXAMPLES]
    assert any("0.5b" in n and "1gpu" in n for n in names) and any("1.5b" in n and "1gpu" in n for n in names)
    assert any("torchrun" in n for n in names)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_parses_validates_and_states_its_memory(path):
    cfg = load_config(str(path), [])
    check_config(cfg)  # raises on any error
    assert cfg.model.path in QWEN and cfg.device == "cuda"
    assert (cfg.data.path, cfg.data.subset, cfg.data.prompt_column) == ("openai/gsm8k", "main", "question")
    assert [r.fn for r in cfg.rewards][0] == "math"
    got, want = stated(path), estimate(cfg)
    for key in ("weights", "gradients", "optimizer", "activations", "trainer"):
        assert got[key] == pytest.approx(want[key], abs=0.051), (key, got[key], want[key])
    if cfg.rollout.engine == "vllm":
        # the trainer's share plus vLLM's reserved share must fit the GPU the header names
        assert want["trainer"] + cfg.rollout.vllm.gpu_memory_utilization * got["gpu"] <= got["gpu"]
    else:
        assert want["trainer"] <= got["gpu"]


@pytest.mark.parametrize("path", CPU_EXAMPLES, ids=[p.stem for p in CPU_EXAMPLES])
def test_cpu_example_parses_and_validates(path):
    """The examples that run here (bench/results/tools_demo.md and code.md run them whole)."""
    cfg = load_config(str(path), [])
    check_config(cfg)
    if path.stem == "code":  # SmolLM2 from `rlvr convert-gguf`, the settings of bench/code.py
        assert cfg.data.task == "code" and [r.fn for r in cfg.rewards] == ["code", "code_compiles"] and not cfg.tools.enabled
    else:
        assert cfg.model.path == "tiny-tools" and cfg.tools.enabled
