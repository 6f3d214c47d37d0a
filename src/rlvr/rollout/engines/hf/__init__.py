"""The hf engine: generation with any transformers causal LM, sharing the trainer's model.

  engine.py          HFEngine (GenerationEngine and MultiTurnEngine): the single-turn decode loop
  forward.py         the model's forward as the decodes use it: generation mode, the prefill, the padding bias
decode steps
  steps.py           the single-turn step and the KV layout it runs on (lean, shared prefix, repeated)
  lean_decode.py     the step of Llama-family models without transformers' per-token machinery
  decode_attention.py   that step's attention on the CPU: write the new keys/values, attend (both layouts)
  native_attention.py   its rows' own slots through a C kernel (native_attention.c), where one builds
  native_prefix.py      the shared layout's prompt part and the merge through a C kernel (native_prefix.c)
  native_rotary.py      the step's q/k rotation and KV write as one C pass with torch's bits (native_rotary.c); its
                        norms through rlvr.models.native_norm (add, RMSNorm and bf16 cast as one C pass)
  compiled_decode.py    that step's layers under torch.compile (rollout.compile=on), products from packed weights
  layer_products.py     that step's products per layer: from the packed weights, q/k/v and gate/up fused where exact
  shared_prefix.py   attention that reads a prompt's keys/values once for its G samples
  episode_decode.py  the multi-turn decode: rows advance independently, tools answer in between
  continuous.py      continuous batching for an outside agent's requests: rows join and leave token by token,
                     a call that continues a row feeds only its new tokens
KV layouts
  kv_buffers.py      cache layers in buffers allocated once (the repeated layout)
  episode_cache.py   the multi-turn cache: each row writes at its own position
  row_cache.py       the continuous decoder's cache: a buffer row per sequence, grown by doubling, and its attention
  attention.py       SDPA in the cache's dtype under bf16 autocast
"""

from rlvr.rollout.engines.hf.engine import HFEngine

__all__ = ["HFEngine"]
