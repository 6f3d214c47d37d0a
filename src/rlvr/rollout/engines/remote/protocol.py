"""What the trainer and a generation server say to each other, whatever engine serves.

A request is token ids in, token ids out: the trainer tokenizes (exactly as its in-process
engines do), the server samples, and the ids it returns are the ids trained, never re-tokenised.
Every answer carries the weight version the server sampled under. A `ServerClient` is the
trainer's handle on one server: rlvr's own (rlvr.rollout.engines.remote.client, engine hf) or
vLLM's OpenAI-compatible server (rlvr.rollout.engines.remote.vllm_client).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, Sequence

from rlvr.dist.transfer import TensorMeta

WEIGHTS_FILE = "weights.safetensors"  # the filesystem sync's file in each version's folder
ADAPTER_CONFIG = "adapter_config.json"  # beside it with LoRA: the adapter's config (peft's file name and keys)


class ServerError(RuntimeError):
    """A server did not answer, answered an error, or broke off a weight sync."""

    def __init__(self, url: str, message: str, status: int | None = None):
        super().__init__(f"generation server {url}: {message}")
        self.url, self.status = url, status

    @property
    def refused_request(self) -> bool:
        """The server is up and refused this request (bad input, a missing token): not a reason to drop it."""
        return self.status is not None and 400 <= self.status < 500


@dataclass(frozen=True)
class GenerateRequest:
    """n samples for each prompt; prompt i's randomness comes from seeds[i] alone."""

    prompt_ids: list[list[int]]  # [B][P_i] token ids, no padding
    n: int
    seeds: list[int]  # [B]
    max_tokens: list[int]  # [B] tokens each sample of prompt i may add
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0
    ignore_eos: bool = False
    stop_strings: list[str] = field(default_factory=list)  # a sample also ends when its text reaches one
    entropy: bool = False  # also return each sampled token's distribution entropy (when the engine has it)
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # over each sample's tokens so far: its prompt (which holds a turn's episode so far), then its own

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> "GenerateRequest":
        return GenerateRequest(**d)

    def rows(self, idx: Sequence[int]) -> "GenerateRequest":
        """The request for prompts `idx` only."""
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return GenerateRequest(
            pick(self.prompt_ids),
            self.n,
            pick(self.seeds),
            pick(self.max_tokens),
            self.temperature,
            self.top_p,
            self.top_k,
            self.ignore_eos,
            list(self.stop_strings),
            self.entropy,
            self.min_p,
            self.repetition_penalty,
        )


@dataclass
class Sample:
    ids: list[int]  # the sampled token ids
    logprobs: list[float]  # the sampler's log-prob of each
    finish: str  # "stop" (EOS or a stop string) or "length" (max_tokens reached first)
    entropy: list[float] | None = None


@dataclass
class GenerateResult:
    samples: list[list[Sample]]  # [B][n], sample j of prompt i at [i][j]
    version: int  # the weight version every sample was drawn under

    def as_json(self) -> dict[str, Any]:
        return {"version": self.version, "samples": [[asdict(s) for s in per] for per in self.samples]}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "GenerateResult":
        return GenerateResult([[Sample(**s) for s in per] for per in d["samples"]], int(d["version"]))


class ServerClient(Protocol):
    """The trainer's handle on one generation server. Every call raises ServerError when the server
    cannot be reached, times out or answers an error."""

    url: str

    def health(self) -> dict[str, Any]:
        """{"engine": ..., "model": ..., "version": int, ...}"""
        ...

    def generate(self, request: GenerateRequest) -> GenerateResult: ...

    def init_weight_transfer(self, host: str, port: int, backend: str, lora: dict[str, Any] | None) -> None:
        """Join the trainer's pair group (rlvr.dist.transfer) as rank 1; blocks until the trainer's side has
        joined too, so the trainer calls it from a thread while it makes its own end. `lora`: the adapter's
        config (r, lora_alpha, target_modules, ...) when only the adapter will be synced."""
        ...

    def update_weights(self, version: int, metas: Sequence[TensorMeta]) -> None:
        """Receive these tensors over the pair group (the trainer broadcasts them meanwhile, from another thread),
        then switch to them as `version`, all at once: generation never sees half of them."""
        ...

    def load_weights(self, version: int, path: str) -> None:
        """Load the weights (or adapter) saved as safetensors in folder `path` as `version` (the filesystem sync)."""
        ...
