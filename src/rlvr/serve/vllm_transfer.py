"""rlvr's weight transfer engine inside vLLM's workers (`--weight-transfer-config '{"backend": "rlvr_gloo"}'`).

vLLM's RL endpoints (/init_weight_transfer_engine, /start_weight_update, /update_weights,
/finish_weight_update) reach the engine registered here in every worker. Its receive side is
rlvr.dist.transfer.WeightReceiver, so the trainer's WeightSender.send(tensors) is all the trainer
runs; the tensors' metas (names, dtypes, shapes) come over HTTP in the update's payload. gloo on
CPU; with backend "nccl" in the init info the same code receives on the worker's GPU.

Everything is received into fresh tensors first and only then loaded (vLLM's in-place layer-wise
reload), so a sync that breaks off leaves the served weights as they were. With LoRA only the
adapter travels: it is written as a peft adapter folder under $RLVR_VLLM_LORA_DIR, named for its
version, and requests then name it (rlvr.serve.vllm_server resolves the name to that folder).

Imported only where vLLM is installed: by the server, and in each worker process through
`--worker-extension-cls` (so the engine is registered there too when vLLM spawns its workers).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from rlvr.dist.transfer import TensorMeta, WeightReceiver

ENGINE_NAME = "rlvr_gloo"
LORA_DIR_ENV = "RLVR_VLLM_LORA_DIR"
LORA_PREFIX = "rlvr-lora-v"  # adapter of weight version N: rlvr-lora-vN
KEEP_ADAPTERS = 2  # folders kept: the current adapter and the one before (a request may still name it)
WEIGHTS_FILE = "weights.safetensors"  # what the filesystem sync writes (as rlvr's hf server reads it)
_ADAPTER_NAME = re.compile(r"\.(lora_[AB])\.[^.]+(\.weight)?$")


def adapter_name(version: int) -> str:
    return f"{LORA_PREFIX}{version}"


@dataclass
class RlvrInitInfo(WeightTransferInitInfo):
    host: str  # the trainer's address: it hosts the pair group's store
    port: int
    backend: str = "gloo"
    timeout: float = 600.0
    lora: dict[str, Any] | None = None  # the adapter's LoraConfig kwargs when only the adapter is synced


@dataclass
class RlvrUpdateInfo(WeightTransferUpdateInfo):
    version: int
    metas: list[list[Any]] | None = None  # [[name, dtype, shape], ...] being broadcast now (TensorMeta.as_json)
    path: str | None = None  # or: a folder holding weights.safetensors (the filesystem sync)


class RlvrWeightTransferEngine(WeightTransferEngine[RlvrInitInfo, RlvrUpdateInfo]):
    init_info_cls = RlvrInitInfo
    update_info_cls = RlvrUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.receiver: WeightReceiver | None = None
        self.lora: dict[str, Any] | None = None
        self._checkpoint: dict[str, tuple[int, ...]] | None = None  # the served checkpoint's tensor shapes, read once

    def init_transfer_engine(self, init_info: RlvrInitInfo) -> None:
        if self.parallel_config.world_size > 1:
            # the pair group has one receiver; a tensor- or pipeline-parallel server would need one per shard
            raise ValueError("rlvr's weight transfer serves a single worker: start one server per GPU (tensor/pipeline parallel size 1)")
        if init_info.lora is not None:
            self._check_lora_capacity(init_info.lora)  # before joining: a refusal must not leave a half-made pair
        self.shutdown()
        self.lora = init_info.lora
        # gloo moves CPU tensors; nccl receives straight onto this worker's GPU
        where = self.device if init_info.backend == "nccl" else torch.device("cpu")
        self.receiver = WeightReceiver(init_info.host, init_info.port, backend=init_info.backend, timeout=init_info.timeout, device=where)

    def start_weight_update(self) -> None:
        """Nothing to prepare: the weights are staged in receive_weights and loaded in one go there."""

    def finish_weight_update(self) -> None:
        """Nothing left: receive_weights has loaded everything (the worker then drops its cached LoRA state)."""

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class synchronizes an accelerator, which a CPU worker does not have
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def receive_weights(self, update_info: RlvrUpdateInfo) -> None:
        tensors, config = self._staged(update_info)
        if any(_ADAPTER_NAME.search(name) for name in tensors):
            self._write_adapter(tensors, config or self.lora, update_info.version)
        else:
            self._check_against_checkpoint(tensors)
            self._load_full(tensors)

    def shutdown(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None

    # ------------------------------------------------------------------ internals

    def _staged(self, info: RlvrUpdateInfo) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
        """Every tensor of this update, complete (or an exception and nothing), and the adapter config found beside them."""
        if info.path is not None:
            from safetensors.torch import load_file

            folder = Path(info.path)
            config_file = folder / "adapter_config.json"
            config = json.loads(config_file.read_text()) if config_file.exists() else None
            return load_file(str(folder / WEIGHTS_FILE)), config
        if info.metas is None:
            raise ValueError("update_weights: the payload needs `metas` (a broadcast) or `path` (a folder)")
        if self.receiver is None:
            raise ValueError("update_weights before init_weight_transfer_engine")
        try:
            return self.receiver.receive([TensorMeta.from_json(m) for m in info.metas]), None
        except Exception:
            self.shutdown()  # the pair group is broken: the trainer makes a new one
            raise

    def _check_against_checkpoint(self, tensors: dict[str, torch.Tensor]) -> None:
        """Names and shapes as in the checkpoint the server loaded, checked before anything is loaded: vLLM's in-place
        reload cannot be undone halfway, and a name it does not know stops its engine."""
        if self._checkpoint is None:
            self._checkpoint = _checkpoint_shapes(Path(self.model_config.model))
        if not self._checkpoint:
            return  # not a local safetensors checkpoint: vLLM's loader is the only check
        tied = bool(getattr(self.model_config.hf_config, "tie_word_embeddings", False))
        unknown = [n for n in tensors if n not in self._checkpoint and not (tied and n.endswith("lm_head.weight"))]
        wrong = [f"{n} {list(t.shape)} vs {list(self._checkpoint[n])}" for n, t in tensors.items() if n in self._checkpoint
                 and tuple(t.shape) != self._checkpoint[n]]  # fmt: skip
        if unknown:
            raise ValueError(f"update_weights: {len(unknown)} weights this server's model does not have, e.g. {unknown[:3]}")
        if wrong:
            raise ValueError(f"update_weights: shapes differ from this server's model: {wrong[:3]}")

    def _load_full(self, tensors: dict[str, torch.Tensor]) -> None:
        """HF-named weights into the served model: vLLM's in-place reload maps and fuses them (q/k/v, gate/up) and
        redoes the kernel repacking done after the first load."""
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        reload_weights(self.vllm_config, self.model, weights_iterator=iter(tensors.items()), weights_path=None, is_checkpoint_format=True)

    def _check_lora_capacity(self, lora: dict[str, Any]) -> None:
        lora_config = self.vllm_config.lora_config
        rank = int(lora.get("r", 8))
        if lora_config is None:
            raise ValueError(
                "this vLLM server was started without LoRA: start it with "
                f"`rlvr serve MODEL --engine vllm --enable-lora --max-lora-rank {rank}` to sync a LoRA adapter"
            )
        if rank > lora_config.max_lora_rank:
            raise ValueError(f"LoRA rank {rank} is above this vLLM server's --max-lora-rank {lora_config.max_lora_rank}")

    def _write_adapter(self, tensors: dict[str, torch.Tensor], config: dict[str, Any] | None, version: int) -> None:
        """A peft adapter folder, made under a temporary name and renamed: the resolver never sees half of one."""
        from safetensors.torch import save_file

        if config is None:
            raise ValueError("LoRA weights arrived without the adapter's config (init_weight_transfer's `lora`)")
        root = Path(os.environ[LORA_DIR_ENV])
        final, tmp = root / adapter_name(version), root / f".incoming-{adapter_name(version)}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        weights = {_saved_name(k): v.contiguous() for k, v in tensors.items()}
        save_file(weights, str(tmp / "adapter_model.safetensors"))
        (tmp / "adapter_config.json").write_text(json.dumps(_adapter_config(config, weights)))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        _prune(root)


def _saved_name(name: str) -> str:
    """The name peft saves an adapter tensor under: no adapter name, under base_model.model.
    (model.layers.0.self_attn.q_proj.lora_A.default.weight -> base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)"""
    name = _ADAPTER_NAME.sub(r".\1.weight", name)
    return name if name.startswith("base_model.model.") else "base_model.model." + name


def _adapter_config(lora: dict[str, Any], weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """adapter_config.json as peft writes it (peft fills its defaults; without peft the given fields), with the
    target modules that really carry an adapter: a pattern such as "all-linear" is peft's to expand, not vLLM's."""
    targets = sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in weights})
    fields = {k: v for k, v in lora.items() if k != "peft_type"} | {"target_modules": targets}
    try:
        from peft import LoraConfig
    except ImportError:
        return {"base_model_name_or_path": "", **fields, "peft_type": "LORA"}
    cfg = LoraConfig(**fields).to_dict()
    cfg.update(peft_type="LORA", target_modules=targets)
    return json.loads(json.dumps(cfg, default=str))


def _checkpoint_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor in a local safetensors checkpoint (headers only); {} when it is not one."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def _prune(root: Path) -> None:
    def version(p: Path) -> int:
        return int(p.name.removeprefix(LORA_PREFIX))

    mine = sorted((p for p in root.iterdir() if p.name.startswith(LORA_PREFIX) and p.name.removeprefix(LORA_PREFIX).isdigit()), key=version)
    for old in mine[:-KEEP_ADAPTERS]:
        shutil.rmtree(old, ignore_errors=True)


def register() -> None:
    """Make `rlvr_gloo` a weight transfer backend in this process (once)."""
    if ENGINE_NAME not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(ENGINE_NAME, RlvrWeightTransferEngine)


class RegisterRlvrTransfer:
    """`--worker-extension-cls`: vLLM imports this class in every worker process before it loads the model, which
    registers rlvr_gloo there even when the workers are spawned (a fresh interpreter) instead of forked. It adds no
    methods to the worker."""


register()
