"""RemoteEngine: the GenerationEngine and MultiTurnEngine of a trainer whose rollouts are made by
generation servers (`rollout.servers`), and the weight sync that keeps those servers current.

Prompts are tokenized here, exactly as the in-process engines tokenize them, and sent as ids; the
sampled ids come back with their log-probs and the weight version they were drawn under, which
every row keeps (Generation.versions, Trace.version). Multi-turn episodes run their turn loop
here, as the colocated vLLM engine does: one request per model turn over the episode so far, the
trainer's tools run between turns, external tokens appended as ids.

Weights go to every live server after each update, as version `version_of()` (the trainer's step):
over a torch.distributed pair group per server (rlvr.dist.transfer), or through a shared folder
(safetensors, then each server loads it). With LoRA only the adapter moves. Under FSDP2 every rank
gathers the full weights (a collective) and rank 0 sends them; all ranks then wait for the sync.
"""

from __future__ import annotations

import json
import shutil
import time
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from rlvr.dist import full_model_state
from rlvr.dist.transfer import WeightSender, backend_for, free_port, metas_of
from rlvr.rollout.engines.protocols import Generation, SamplingParams
from rlvr.rollout.engines.remote.pool import ServerPool
from rlvr.rollout.engines.remote.protocol import ADAPTER_CONFIG, WEIGHTS_FILE, GenerateRequest, ServerClient, ServerError
from rlvr.rollout.engines.sampling import row_seed
from rlvr.rollout.engines.turns import (
    FORCE,
    SAMPLE,
    WAIT,
    StopMatcher,
    Trace,
    TurnDriver,
    eos_ids,
    resume_ready,
    take_external,
    take_sampled,
)
from rlvr.rollout.episodes import pad_rows

LORA_KEYS = ("r", "lora_alpha", "lora_dropout", "bias", "use_rslora", "modules_to_save", "fan_in_fan_out", "init_lora_weights")


@dataclass
class SyncStats:
    seconds: float = 0.0
    bytes: int = 0
    syncs: int = 0


class RemoteEngine:
    def __init__(
        self,
        model,
        tokenizer,
        pool: ServerPool,
        *,
        dist,
        version_of: Callable[[], int],
        weight_sync: str = "distributed",
        weight_dir: str | None = None,
        trainer_host: str = "127.0.0.1",
        timeout: float = 600.0,
        transfer_backend: str | None = None,
    ):
        """`transfer_backend`: gloo or nccl for weight_sync=distributed (default: nccl when the trainer is on a GPU)."""
        self.model, self.tokenizer, self.pool, self.dist = model, tokenizer, pool, dist
        self.version_of, self.weight_sync, self.trainer_host, self.timeout = version_of, weight_sync, trainer_host, timeout
        self.weight_dir = Path(weight_dir) if weight_dir else None
        self.version: int | None = None  # the version every live server holds, once synced
        self.sync_stats = SyncStats()
        self._senders: dict[str, WeightSender] = {}
        self._device = next(model.parameters()).device
        self.transfer_backend = transfer_backend or backend_for(self._device)

    # ---------------------------------------------------------------- generation

    def _tokenize(self, prompts: Sequence[str]) -> list[list[int]]:
        return [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def generate(self, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int]) -> Generation:
        prompt_ids = self._tokenize(prompts)
        request = GenerateRequest(
            prompt_ids,
            params.n,
            [int(s) for s in seeds],
            [params.max_new_tokens] * len(prompts),
            params.temperature,
            params.top_p,
            params.top_k,
            params.ignore_eos,
            entropy=params.temperature > 0,
            min_p=params.min_p,
            repetition_penalty=params.repetition_penalty,
        )
        samples, versions = self.pool.generate(request)
        rows = [s for per in samples for s in per]
        pad, T = self._pad_id(), params.max_new_tokens
        prompt, prompt_mask = pad_rows([ids for ids in prompt_ids for _ in range(params.n)], pad, left=True)
        comp, mask = pad_rows([s.ids for s in rows], pad, min_width=T)  # the in-process engines' width: the same shapes
        logp, _ = pad_rows([s.logprobs for s in rows], 0.0, min_width=T, dtype=torch.float32)
        entropy = None
        if params.temperature > 0 and all(s.entropy is not None for s in rows):
            entropy, _ = pad_rows([s.entropy or [] for s in rows], 0.0, min_width=T, dtype=torch.float32)
        dev = self._device
        return Generation(
            prompt.to(dev),
            prompt_mask.to(dev),
            comp.to(dev),
            mask.to(dev),
            logp.to(dev),
            torch.tensor([s.finish == "length" for s in rows], device=dev),
            self.tokenizer.batch_decode(comp, skip_special_tokens=True),
            None if entropy is None else entropy.to(dev),
            versions=torch.tensor(versions, dtype=torch.long).repeat_interleave(params.n),
        )

    def sample(self, request: GenerateRequest) -> list:
        """The samples of a token-id request (rlvr.rollout.sources.agent's Sampler): spread over the servers."""
        return self.pool.generate(request)[0]

    def generate_episodes(
        self, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int], driver: TurnDriver
    ) -> tuple[torch.Tensor, torch.Tensor, list[Trace]]:
        """One request per model turn of every row that samples; the tools run between turns here."""
        prompt_ids, G, T = self._tokenize(prompts), params.n, params.max_new_tokens
        traces = [Trace() for _ in range(len(prompts) * G)]
        requests = [0] * len(traces)
        stop, eos = StopMatcher(self.tokenizer, driver.stop_strings), eos_ids(self.model, self.tokenizer)
        while True:
            rows = [r for r, tr in enumerate(traces) if tr.mode == SAMPLE]
            if rows:
                request = GenerateRequest(
                    [prompt_ids[r // G] + traces[r].ids for r in rows],
                    1,
                    [row_seed(seeds[r // G], r % G, requests[r]) for r in rows],
                    [T - len(traces[r].ids) for r in rows],
                    params.temperature,
                    params.top_p,
                    params.top_k,
                    params.ignore_eos,
                    list(driver.stop_strings),
                    min_p=params.min_p,
                    repetition_penalty=params.repetition_penalty,
                )
                samples, versions = self.pool.generate(request)
                for r, per, v in zip(rows, samples, versions):
                    requests[r] += 1
                    tr = traces[r]
                    tr.version = v if tr.version is None else min(tr.version, v)  # the oldest weights any of its turns saw
                    s = per[0]
                    take_sampled(tr, r, s.ids, s.logprobs, driver=driver, stop=stop, eos=eos, ignore_eos=params.ignore_eos, budget=T)
            resume_ready(traces, driver, T)
            for tr in traces:
                if tr.mode == FORCE:
                    take_external(tr, T)
            if not any(t.mode in (SAMPLE, WAIT) for t in traces):
                break
        ids, mask = pad_rows(prompt_ids, self._pad_id(), left=True)
        return ids.to(self._device), mask.to(self._device), traces

    # ---------------------------------------------------------------- weights

    def take_sync_stats(self) -> SyncStats:
        stats, self.sync_stats = self.sync_stats, SyncStats()
        return stats

    def sync_weights(self) -> None:
        """Every live server gets the trainer's weights as version version_of(); a server the sync fails on is dropped."""
        t0, version = time.perf_counter(), self.version_of()
        tensors = self._weights()  # a collective under FSDP2: every rank
        if self.dist.is_main:
            servers = self.pool.live()
            push = self._push_distributed if self.weight_sync == "distributed" else self._push_file(tensors, version)
            with ThreadPoolExecutor(len(servers)) as ex:
                results = list(ex.map(lambda s: self._try(push, s, tensors, version), servers))
            self.sync_stats.bytes += sum(results)
        self.dist.barrier("weight sync to the generation servers")
        self.version = version
        self.sync_stats.seconds += time.perf_counter() - t0
        self.sync_stats.syncs += 1

    def _try(self, push, server: ServerClient, tensors, version: int) -> int:
        try:
            return push(server, tensors, version)
        except ServerError as e:
            if e.refused_request:
                raise
            self._forget(server, e)
        except Exception as e:  # the pair group broke (peer gone, timeout)
            self._forget(server, ServerError(server.url, f"weight sync failed: {e}"))
        return 0

    def _forget(self, server: ServerClient, error: Exception) -> None:
        self.pool.drop(server, error)
        sender = self._senders.pop(server.url, None)
        if sender is not None:
            sender.close()

    def _weights(self) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) of what the servers need: the LoRA adapter only, else every parameter under every name it
        has. A tied lm_head goes under its own name too: vLLM's in-place reload on CPU repacks lm_head's kernel from
        the weights named lm_head only, so sending embed_tokens alone left its output layer on the old weights."""
        named = list(self.model.named_parameters(remove_duplicate=False))
        names = [n for n, _ in named if not self._lora() or "lora_" in n]
        full = full_model_state(self.dist, self.model)
        if full is None:
            params = dict(named)
            return [(n, params[n].detach()) for n in names]
        return [(n, full[n]) for n in names if n in full] if self.dist.is_main else []

    def _lora(self) -> bool:
        return hasattr(self.model, "peft_config")

    def lora_config(self) -> dict | None:
        if not self._lora():
            return None
        cfg = self.model.peft_config["default"]
        out = {k: getattr(cfg, k) for k in LORA_KEYS if hasattr(cfg, k)}
        out["target_modules"] = sorted(cfg.target_modules) if isinstance(cfg.target_modules, (set, list)) else cfg.target_modules
        return out

    def _push_distributed(self, server: ServerClient, tensors, version: int) -> int:
        sender = self._senders.get(server.url) or self._connect(server)
        with ThreadPoolExecutor(1) as ex:
            answer = ex.submit(server.update_weights, version, metas_of(tensors))
            sent = sender.send(tensors)
            answer.result()
        return sent

    def _connect(self, server: ServerClient) -> WeightSender:
        """The pair group with `server` (it joins from its HTTP handler while this side hosts the store). A server that
        refuses to join fails this at once: the store's own wait (up to the timeout) is left to a daemon thread."""
        port, backend = free_port(), self.transfer_backend
        made: Future[WeightSender] = Future()

        def host() -> None:
            try:
                made.set_result(WeightSender(self.trainer_host, port, backend=backend, timeout=self.timeout, device=self._device))
            except BaseException as e:  # the trainer's thread raises it
                made.set_exception(e)

        threading.Thread(target=host, name="rlvr-weight-store", daemon=True).start()
        server.init_weight_transfer(self.trainer_host, port, backend, self.lora_config())  # ServerError when refused
        sender = made.result(timeout=self.timeout)
        self._senders[server.url] = sender
        return sender

    def _push_file(self, tensors, version: int):
        """Write the weights once into weight_dir/v<version> (atomically), then each server loads them."""
        from safetensors.torch import save_file

        assert self.weight_dir is not None, "checked by the config"
        final = self.weight_dir / f"v{version:07d}"
        tmp = self.weight_dir / f".v{version:07d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({n: t.detach().cpu().contiguous().clone() for n, t in tensors}, str(tmp / WEIGHTS_FILE))
        if (lora := self.lora_config()) is not None:  # the server makes its adapter from it on the first load
            (tmp / ADAPTER_CONFIG).write_text(json.dumps({**lora, "peft_type": "LORA"}))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in self.weight_dir.glob("v*"):
            if old != final and old.name < final.name:
                shutil.rmtree(old, ignore_errors=True)
        nbytes = (final / WEIGHTS_FILE).stat().st_size

        def push(server: ServerClient, _tensors, v: int) -> int:
            server.load_weights(v, str(final.resolve()))
            return nbytes

        return push
