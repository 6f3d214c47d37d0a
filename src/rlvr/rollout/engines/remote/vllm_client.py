"""The trainer's handle on a vLLM server started by `rlvr serve MODEL --engine vllm` (rlvr.serve.vllm_server).

Generation goes through vLLM's token-in/token-out endpoint /inference/v1/generate: one request per
prompt (its own seed, its own token budget), sent concurrently, answered with the sampled ids, each
one's log-prob, and the weight version each token was sampled under. A prompt answered under an
older version than the batch's newest (a sync landed between two requests) is asked again, so
every sample of a result comes from one version. Stop strings are vLLM's own (`stop` with the stop
string kept in the output): generation ends at the token whose text completes one, and the ids
returned are exactly the ids sampled.

A weight sync is vLLM's: /pause (in-flight requests finish first, under the old weights) ->
/start_weight_update -> /update_weights (the server receives the trainer's broadcast meanwhile) ->
/finish_weight_update (the new version) -> /resume. With LoRA the server writes the adapter as a
folder named for its version and requests name that adapter from then on.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

from rlvr.dist.transfer import TensorMeta
from rlvr.rollout.engines.remote.protocol import GenerateRequest, GenerateResult, Sample, ServerError
from rlvr.rollout.engines.sampling import SEED_RANGE

LORA_PREFIX = "rlvr-lora-v"  # as rlvr.serve.vllm_transfer names adapters (that module needs vLLM to import)
RETRIES = 3  # rounds of asking again for prompts answered under an older version than the batch's newest


def parse_version(label: str | None) -> int:
    """vLLM's weight version label: "default" (the weights it started with) is version 0."""
    if label in (None, "default"):
        return 0
    try:
        return int(str(label))
    except ValueError:
        raise ValueError(f"weight version {label!r} is not one rlvr set (an integer)") from None


class VLLMServerClient:
    """ServerClient (rlvr.rollout.engines.remote.protocol) of vLLM's server with rlvr's weight transfer."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 600.0, max_concurrency: int = 64):
        self.url = url.rstrip("/")
        self.api_key, self.timeout = api_key, timeout
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="vllm-client")
        self.lora: dict[str, Any] | None = None
        self.adapter: str | None = None  # the adapter requests name (LoRA), None: the base model

    # ------------------------------------------------------------------ HTTP

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:800]
            raise ServerError(self.url, f"{method} {path}: HTTP {e.code}: {detail}", e.code) from None  # 4xx: refused, not down
        except (urllib.error.URLError, OSError) as e:
            raise ServerError(self.url, f"{method} {path}: {getattr(e, 'reason', e)}") from None
        try:
            return json.loads(raw) if raw.strip() else None
        except json.JSONDecodeError:
            return raw.decode(errors="replace")

    def _post(self, path: str, body: Any = None) -> Any:
        return self._call("POST", path, {} if body is None else body)

    # ------------------------------------------------------------------ ServerClient

    def health(self) -> dict[str, Any]:
        self._call("GET", "/health")
        models = self._call("GET", "/v1/models") or {}
        name = next((m["id"] for m in models.get("data", []) if not m.get("parent")), None)
        version = parse_version((self._call("GET", "/weight_info") or {}).get("weight_version"))
        return {"engine": "vllm", "model": name, "version": version, "adapter": self.adapter}

    def generate(self, request: GenerateRequest) -> GenerateResult:
        B = len(request.prompt_ids)
        if len(request.seeds) != B or len(request.max_tokens) != B:
            raise ServerError(self.url, "generate: prompt_ids, seeds and max_tokens must have one entry per prompt")
        samples: list[list[Sample] | None] = [None] * B
        versions: list[int | None] = [None] * B  # None: the prompt's samples straddle a sync (or it has no tokens)
        todo = [i for i in range(B) if request.max_tokens[i] > 0]
        for i in range(B):
            if request.max_tokens[i] <= 0:
                samples[i] = [Sample([], [], "length") for _ in range(request.n)]
        for _ in range(RETRIES):
            for i, (got, version) in zip(todo, self.pool.map(lambda i: self._one(request, i), todo)):
                samples[i], versions[i] = got, version
            newest = max((v for v in versions if v is not None), default=None)
            todo = [i for i in todo if versions[i] is None or versions[i] != newest]
            if not todo:
                version = newest if newest is not None else self.health()["version"]
                return GenerateResult([s for s in samples if s is not None], version)
        raise ServerError(self.url, f"the weights changed during each of {RETRIES} tries to answer a batch under one version")

    def _one(self, request: GenerateRequest, i: int) -> tuple[list[Sample], int | None]:
        """Prompt i's n samples and the version they were all drawn under (None when a sync split them)."""
        body: dict[str, Any] = {
            "token_ids": list(request.prompt_ids[i]),
            "sampling_params": self._params(request, i),
            "output_mode": "tokens",
        }
        if self.adapter is not None:
            body["model"] = self.adapter
        choices = sorted(self._post("/inference/v1/generate", body)["choices"], key=lambda c: c["index"])
        out: list[Sample] = []
        seen: set[int] = set()
        for c in choices:
            out.append(self._sample(c))
            seen.update(parse_version(s["version"]) for s in c.get("weight_versions") or [])
        return out, (seen.pop() if len(seen) == 1 else None)

    def _params(self, request: GenerateRequest, i: int) -> dict[str, Any]:
        greedy = request.temperature == 0
        params: dict[str, Any] = {
            "n": request.n,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": request.top_k,
            "min_p": request.min_p,
            "repetition_penalty": request.repetition_penalty,
            "max_tokens": request.max_tokens[i],
            "ignore_eos": request.ignore_eos,
            "seed": None if greedy else int(request.seeds[i]) % SEED_RANGE,  # prompt i's noise from seeds[i] alone
            "logprobs": 0,  # the sampled token's log-prob only
            "detokenize": bool(request.stop_strings),  # vLLM matches stop strings on the text
        }
        if request.stop_strings:
            # the token that completes a stop string is kept, so the ids are all the ids sampled
            params.update(stop=list(request.stop_strings), include_stop_str_in_output=True)
        return params

    def _sample(self, choice: dict[str, Any]) -> Sample:
        ids = list(choice.get("token_ids") or [])
        content = (choice.get("logprobs") or {}).get("content") or []
        if len(content) != len(ids) or any(c["token_id"] != t for c, t in zip(content, ids)):
            raise ServerError(self.url, "generate: the log-probs do not line up with the sampled tokens")
        finish = choice.get("finish_reason")
        if finish not in ("stop", "length"):
            raise ServerError(self.url, f"generate: a sample ended with {finish!r} (aborted?), not stop or length")
        return Sample(ids, [float(c["logprob"]) for c in content], finish)

    def init_weight_transfer(self, host: str, port: int, backend: str, lora: dict[str, Any] | None) -> None:
        info = {"host": host, "port": int(port), "backend": backend, "timeout": self.timeout, "lora": lora}
        self._post("/init_weight_transfer_engine", {"init_info": info})
        self.lora = lora

    def update_weights(self, version: int, metas: Sequence[TensorMeta]) -> None:
        self._sync(version, {"version": int(version), "metas": [m.as_json() for m in metas]}, self.lora is not None)

    def load_weights(self, version: int, path: str) -> None:
        self._sync(version, {"version": int(version), "path": str(path)}, self.lora is not None or _holds_adapter(path))

    def _sync(self, version: int, update_info: dict[str, Any], adapter: bool) -> None:
        """pause (in-flight requests finish under the old weights) -> load -> name the new version -> resume; the server
        resumes whatever happened, and keeps its old weights and version when the load breaks off."""
        self._post("/pause?mode=wait")
        try:
            self._post("/start_weight_update")
            self._post("/update_weights", {"update_info": update_info})
            self._post("/finish_weight_update", {"weight_version": str(int(version))})
            # prompts' KV blocks cached under the old weights would be reused by the new version's requests
            self._post("/reset_prefix_cache")
            old, self.adapter = self.adapter, (f"{LORA_PREFIX}{int(version)}" if adapter else None)
        finally:
            self._post("/resume")
        if old is not None and old != self.adapter:
            try:  # drop the old name from vLLM's registry (the worker's LRU evicts its weights)
                self._post("/v1/unload_lora_adapter", {"lora_name": old})
            except ServerError:
                pass  # never resolved (no request named it): nothing to drop

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _holds_adapter(path: str) -> bool:
    """Whether a filesystem sync's folder holds a LoRA adapter (its tensors' names), read from the safetensors header."""
    from safetensors import safe_open

    with safe_open(str(Path(path) / "weights.safetensors"), framework="pt") as f:
        return any(".lora_A." in k or ".lora_B." in k for k in f.keys())
