"""The benches' random-weight Llamas on rlvr's character tokenizer (compare_trl.py, floor.py, engines.py,
lora_memory.py): the same builder, each bench with its own sizes."""

from __future__ import annotations

from pathlib import Path


def char_llama(path: Path, dims: dict, *, max_positions: int = 1024, tie: bool = False) -> Path:
    """Writes a seed-0 LlamaForCausalLM with `dims` (hidden_size, intermediate_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, optionally vocab_size or any other LlamaConfig field, which wins over
    max_positions and tie) and the character tokenizer to `path`, unless it is there. A vocab_size past the
    tokenizer's is a padded vocabulary, as real checkpoints have (the lm_head and the vocabulary-wide log-softmax
    cost what a real tokenizer's would): those rows of the lm_head are zero and the tokenizer's rows are scaled x40,
    so that the sampled tokens stay the tokenizer's, as a trained head's would."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.models.tokenizer import build_char_tokenizer

    if (path / "model.safetensors").exists():
        return path
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    # dims may set any LlamaConfig field, these defaults included (a shape's own max_position_embeddings or tying)
    settings = {"vocab_size": len(tok), "max_position_embeddings": max_positions, "tie_word_embeddings": tie, **dims}
    tok.model_max_length = settings["max_position_embeddings"]
    cfg = LlamaConfig(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, **settings)
    model = LlamaForCausalLM(cfg)
    if cfg.vocab_size > len(tok):
        with torch.no_grad():
            model.lm_head.weight[len(tok) :] = 0
            model.lm_head.weight[: len(tok)] *= 40
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
