"""Small Llama configs for the character tokenizer: the bundled model and the tests' random models."""

from __future__ import annotations

from transformers import LlamaConfig


def char_llama_config(
    tok, *, hidden_size: int = 128, intermediate_size: int = 384, num_layers: int = 4, num_heads: int = 4, max_positions: int = 128
) -> LlamaConfig:
    """A tied-embedding Llama sized for `tok` (rlvr.models.tokenizer.build_char_tokenizer)."""
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        # transformers 5 still takes rope_theta (into rope_parameters) but its generated signature omits it; 4.x needs it
        rope_theta=10000.0,  # type: ignore[call-arg]
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
