"""rlvr's hf engine behind a generation server.

Requests are token ids (rlvr.rollout.engines.remote.protocol). A request whose samples all share one
token budget and need no stop strings (single-turn rollouts) runs the engine's own `generate`, the
code in-process training runs, on the same ids and seeds: the same tokens and log-probs. One that
needs stop strings (a model turn of a multi-turn episode) runs the multi-turn decode with a driver
that ends every episode at its first turn's end.

Generation and weight swaps run on `work`'s thread (`rlvr serve`: its main thread, rlvr.serve.main_thread).
Weights: generation and a weight swap never overlap (one lock), and a sync is received into fresh
tensors first (rlvr.dist.transfer), outside the lock, so generation goes on while weights arrive
and a sync that breaks off leaves the old weights and version in place. A sync that arrives while a
batch is being generated is answered once it is staged, not once it is swapped in: the swap happens
before the next request is served (or at once when none runs), so the trainer does not wait for a
batch it did not ask for, and every answer still comes from one version.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Sequence

import torch

from rlvr.dist.transfer import TensorMeta, WeightReceiver
from rlvr.models.precision import autocast_context
from rlvr.rollout.engines.protocols import SamplingParams
from rlvr.rollout.engines.remote.protocol import ADAPTER_CONFIG, WEIGHTS_FILE, GenerateRequest, GenerateResult, Sample
from rlvr.serve.main_thread import InlineWork, MainThreadWork


class _FirstTurn:
    """TurnDriver: every episode ends with its first model turn (the trainer runs the tools)."""

    def __init__(self, stop_strings: Sequence[str]):
        self.stop_strings = list(stop_strings)
        self.ended: set[int] = set()

    def end_turn(self, row: int, turn_ids: list[int], eos: bool) -> bool:
        self.ended.add(row)
        return False

    def ready(self, block: bool) -> dict[int, list[int] | None]:
        return {}


class HFBackend:
    def __init__(
        self,
        model,
        tokenizer,
        *,
        name: str,
        autocast: str = "none",
        timeout: float = 600.0,
        work: InlineWork | MainThreadWork | None = None,
    ):
        """`work`: the thread generation and weight swaps run on (`rlvr serve`: its main thread); default: the caller's."""
        from rlvr.rollout.engines.hf import HFEngine

        self.model, self.tokenizer, self.name, self.autocast, self.timeout = model, tokenizer, name, autocast, timeout
        self.engine = HFEngine(model, tokenizer, keep_merged=True)  # a LoRA adapter stays merged between weight updates
        self.device = next(model.parameters()).device
        self.version = 0
        self.lock = threading.Lock()  # held while generating and while swapping weights in
        self._pending: tuple[dict[str, torch.Tensor], int] | None = None  # staged weights waiting for the lock
        self._copying: int | None = None  # the version whose weights are being copied in (staged no more, not yet live)
        self._pending_lock = threading.Lock()
        self.receiver: WeightReceiver | None = None
        self.requests = 0
        self.work = work or InlineWork()

    def health(self) -> dict[str, Any]:
        """`version`: what the next request is sampled under (staged weights included)."""
        # read in the order _apply_pending writes (staged, then copying, then live), so a swap in progress reads as the
        # incoming version, never the one it replaces
        pending, copying = self._pending, self._copying
        version = pending[1] if pending is not None else copying if copying is not None else self.version
        return {"engine": "hf", "model": self.name, "version": version, "lora": self._is_peft(), "requests": self.requests}

    # ---------------------------------------------------------------- generation

    def generate(self, req: GenerateRequest) -> GenerateResult:
        if len(req.seeds) != len(req.prompt_ids) or len(req.max_tokens) != len(req.prompt_ids):
            raise ValueError("generate: prompt_ids, seeds and max_tokens must have one entry per prompt")
        if not req.prompt_ids:
            return GenerateResult([], self.version)
        return self.work.call(lambda: self._generate(req))

    def _generate(self, req: GenerateRequest) -> GenerateResult:
        with self.lock:
            self._apply_pending()  # before the region: it writes weights the region swaps for kept bf16 copies
            self.requests += 1
            with autocast_context(self.autocast, self.device, self.model):
                if not req.stop_strings and len(set(req.max_tokens)) == 1:
                    return GenerateResult(self._completions(req), self.version)
                return GenerateResult(self._turns(req), self.version)

    def _params(self, req: GenerateRequest, max_tokens: int) -> SamplingParams:
        return SamplingParams(req.n, req.temperature, req.top_p, req.top_k, max_tokens, req.ignore_eos, req.min_p, req.repetition_penalty)

    def _completions(self, req: GenerateRequest) -> list[list[Sample]]:
        gen = self.engine.generate(req.prompt_ids, self._params(req, req.max_tokens[0]), req.seeds)  # type: ignore[arg-type]
        out: list[list[Sample]] = []
        for i in range(len(req.prompt_ids)):
            per = []
            for r in range(i * req.n, (i + 1) * req.n):
                keep = gen.completion_mask[r].bool()
                ent = None if not req.entropy or gen.sampling_entropy is None else gen.sampling_entropy[r][keep].tolist()
                finish = "length" if bool(gen.truncated[r]) else "stop"
                per.append(Sample(gen.completion_ids[r][keep].tolist(), gen.sampling_logprobs[r][keep].tolist(), finish, ent))
            out.append(per)
        return out

    def _turns(self, req: GenerateRequest) -> list[list[Sample]]:
        """One model turn per sample (EOS or a stop string ends it), each cut to its prompt's own budget."""
        driver = _FirstTurn(req.stop_strings)
        _, _, traces = self.engine.generate_episodes(req.prompt_ids, self._params(req, max(req.max_tokens)), req.seeds, driver)  # type: ignore[arg-type]
        out: list[list[Sample]] = []
        for i, budget in enumerate(req.max_tokens):
            per = []
            for r in range(i * req.n, (i + 1) * req.n):
                tr = traces[r]
                ended = r in driver.ended and len(tr.ids) <= budget
                per.append(Sample(tr.ids[:budget], tr.logps[:budget], "stop" if ended else "length"))
            out.append(per)
        return out

    # ---------------------------------------------------------------- weights

    def _adapter(self, lora: dict | None) -> None:
        """Wrap the model in the trainer's LoRA adapter (once): the syncs then carry the adapter only."""
        if lora is None or self._is_peft():
            return
        from peft import LoraConfig, get_peft_model

        with self.lock:
            self.model = get_peft_model(self.model, LoraConfig(**{k: v for k, v in lora.items() if k != "peft_type"}))
            self.engine.model = self.model

    def init_weight_transfer(self, host: str, port: int, backend: str, lora: dict | None) -> None:
        self._adapter(lora)
        old, self.receiver = self.receiver, None
        if old is not None:
            old.close()
        self.receiver = WeightReceiver(host, port, backend=backend, timeout=self.timeout, device=self.device)

    def update_weights(self, version: int, metas: Sequence[TensorMeta]) -> None:
        if self.receiver is None:
            raise ValueError("update_weights before init_weight_transfer")
        self._check_names(metas)
        try:
            tensors = self.receiver.receive(metas)  # outside the lock: generation goes on meanwhile
        except Exception:
            self.receiver.close()  # the pair group is broken; the trainer makes a new one
            self.receiver = None
            raise
        self._swap(tensors, version)

    def load_weights(self, version: int, path: str) -> None:
        from safetensors.torch import load_file

        if (Path(path) / ADAPTER_CONFIG).exists():
            self._adapter(json.loads((Path(path) / ADAPTER_CONFIG).read_text()))
        tensors = load_file(str(Path(path) / WEIGHTS_FILE), device=str(self.device))
        self._check_names([TensorMeta.of(k, v) for k, v in tensors.items()])
        self._swap(tensors, version)

    def _params_by_name(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters(remove_duplicate=False))  # a tied lm_head under its own name too

    def _check_names(self, metas: Sequence[TensorMeta]) -> None:
        params = self._params_by_name()
        unknown = [m.name for m in metas if m.name not in params]
        if unknown:
            raise ValueError(f"update_weights: {len(unknown)} weights this server's model does not have, e.g. {unknown[:3]}")
        wrong = [f"{m.name} {list(m.shape)} vs {list(params[m.name].shape)}" for m in metas if tuple(params[m.name].shape) != m.shape]
        if wrong:
            raise ValueError(f"update_weights: shapes differ from this server's model: {wrong[:3]}")

    def _swap(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """Stage the weights as `version`; swap them in now if no batch is being generated, else before the next one."""
        with self._pending_lock:
            self._pending = (tensors, version)  # a newer sync replaces one still waiting
        self.work.post(self._apply_if_idle)  # not waited for: the trainer is answered once the weights are staged

    def _apply_if_idle(self) -> None:
        if self.lock.acquire(blocking=False):
            try:
                self._apply_pending()
            finally:
                self.lock.release()

    @torch.no_grad()
    def _apply_pending(self) -> None:
        """Under self.lock: the staged weights, if any, into the model."""
        with self._pending_lock:
            pending = self._pending
            if pending is None:
                return
            self._copying = pending[1]  # set before the staged weights go: health() always reads one of the two
            self._pending = None
        params = self._params_by_name()
        for name, t in pending[0].items():
            params[name].copy_(t)
        self.version = pending[1]
        self._copying = None

    def _is_peft(self) -> bool:
        return hasattr(self.model, "peft_config")
