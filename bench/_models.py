"""The benches' random-weight Llamas on rlvr's character tokenizer (compare_trl.py, floor.py, engines.py,
lora_memory.py): the same builder, each bench with its own sizes."""

from __future__ import annotations

from pathlib import Path


def char_llama(path: Path, dims: dict, *, max_positions: int = 1024, tie: bool = False) -> Path:
    """Writes a seed-0 LlamaForCausalLM with `dims` (hidden_size, intermediate_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads) and the character tokenizer to `path`, unless it is there."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.models.tokenizer import build_char_tokenizer

    if (path / "model.safetensors").exists():
        return path
    tok = build_char_tokenizer()
    tok.model_max_length = max_positions
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        **dims,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path
