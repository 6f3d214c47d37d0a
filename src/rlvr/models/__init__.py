"""The bundled tiny models (`tiny`, `tiny-tools`), and loading any Hugging Face causal LM with its tokenizer."""

from __future__ import annotations

from pathlib import Path

BUNDLED = {"tiny": Path(__file__).parent / "tiny", "tiny-tools": Path(__file__).parent / "tiny-tools"}


def resolve_model_path(name_or_path: str) -> str:
    """`tiny` (or `bundled:tiny`) names the model shipped in the package; anything else is a
    local folder or a hub id, handed to transformers as is."""
    key = name_or_path.removeprefix("bundled:")
    if key in BUNDLED:
        return str(BUNDLED[key])
    return name_or_path
