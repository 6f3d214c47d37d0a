"""The benches' random-weight Llamas on rlvr's character tokenizer (compare_trl.py, floor.py, engines.py,
lora_memory.py): the same builder, each bench with its own sizes."""

from __future__ import annotations

from pathlib import Path


ARCHITECTURES = {"llama": "Llama", "qwen3": "Qwen3", "qwen2": "Qwen2", "mistral": "Mistral"}  # dims["model_type"] -> transformers' prefix


def char_llama(path: Path, dims: dict, *, max_positions: int = 1024, tie: bool = False) -> Path:
    """Writes a seed-0 LlamaForCausalLM with `dims` (hidden_size, intermediate_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, optionally vocab_size or any other LlamaConfig field, which wins over
    max_positions and tie) and the character tokenizer to `path`, unless it is there. dims["model_type"] "qwen3",
    "qwen2" or "mistral" builds that architecture of the Llama family instead (qwen3: RMSNorms on each head's q and k,
    head_dim free of hidden_size / heads). A vocab_size past the
    tokenizer's is a padded vocabulary, as real checkpoints have (the lm_head and the vocabulary-wide log-softmax
    cost what a real tokenizer's would): those rows of the lm_head are zero and the tokenizer's rows are scaled x40,
    so that the sampled tokens stay the tokenizer's, as a trained head's would."""
    import torch
    import transformers

    from rlvr.models.tokenizer import build_char_tokenizer

    if (path / "model.safetensors").exists():
        return path
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    # dims may set any LlamaConfig field, these defaults included (a shape's own max_position_embeddings or tying)
    settings = {"vocab_size": len(tok), "max_position_embeddings": max_positions, "tie_word_embeddings": tie, **dims}
    kind = ARCHITECTURES[settings.pop("model_type", "llama")]
    tok.model_max_length = settings["max_position_embeddings"]
    config = getattr(transformers, f"{kind}Config")
    cfg = config(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, **settings)
    model = getattr(transformers, f"{kind}ForCausalLM")(cfg)
    if cfg.vocab_size > len(tok):
        with torch.no_grad():
            model.lm_head.weight[len(tok) :] = 0
            model.lm_head.weight[: len(tok)] *= 40
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
