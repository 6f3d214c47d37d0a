"""Shared fixtures: a tiny random Llama with the project's character tokenizer, built once per session.

Trainer-level tests pass `model.path=<tiny_model_dir>` so they never depend on the bundled model
(or on anything downloaded).
"""

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    import torch
    from transformers import LlamaForCausalLM

    from rlvr.models.build import char_llama_config

    from rlvr.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    torch.manual_seed(1234)
    model = LlamaForCausalLM(char_llama_config(tok, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2))
    path = tmp_path_factory.mktemp("tiny_random_model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
