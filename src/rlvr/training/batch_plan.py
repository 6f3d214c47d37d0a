"""The batch plan: how a step's prompts and completions split across ranks and micro-batches,
which fast paths apply, and a rough memory estimate per rank. Every derived value is resolved
here, once; the update reads the plan, and the plan printed at start-up is what runs.
(Impossible splits are refused earlier, by rlvr.config.validate.batch_split_errors.)"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlvr import algo
from rlvr.models.compiled import COMPILE_WINS_ON

GiB = 1024**3


PACKING_PIECES = 4  # with a whole-step micro-batch, packing by length cuts the rows into this many


@dataclass(frozen=True)
class BatchPlan:
    """Every derived batch setting, resolved once from the config; the update reads these."""

    world_size: int
    prompts: int
    group_size: int
    micro_batch_size: int  # completions per forward/backward per rank (optim.micro_batch_size, 0 resolved)
    steps_per_generation: int  # minibatches per batch, each its own optimizer step (optim.steps_per_generation)
    shared_prefix: bool  # training forward runs each group's prompt once (single process, no checkpointing, not compiled)
    compiled_forward: bool  # training forward+backward under torch.compile at bucketed lengths (optim.compile)
    skip_zero_advantage: bool  # rows with advantage exactly 0 skip forward/backward (their gradient is zero)
    skip_while_no_bonus: bool  # adaptive_entropy: they skip in the steps whose applied coefficient is 0
    pack_by_length: bool  # rows may be sorted by length into micro-batches when that computes fewer tokens
    packing_pieces: int | None  # micro-batches packing cuts a whole-step batch into (None: micro_batch_size rows each)
    num_params: int
    trainable_params: int
    param_bytes: int  # bytes per weight
    seq_len: int  # longest prompt + completion, tokens (estimate)
    completion_len: int  # max_new_tokens: the positions that get logits
    hidden: int
    layers: int
    vocab: int
    strategy: str = "ddp"
    gradient_checkpointing: bool = False

    @classmethod
    def build(cls, cfg, world_size: int, model, prompt_tokens: int = 64) -> "BatchPlan":
        r, o, a = cfg.rollout, cfg.optim, cfg.algo
        params = list(model.parameters())
        c = getattr(model, "config", None)
        n = sum(p.numel() for p in {id(p): p for p in params}.values())
        t = sum(p.numel() for p in {id(p): p for p in params if p.requires_grad}.values())
        per_rank = r.completions_per_step // world_size
        minibatch = -(-per_rank // o.steps_per_generation)  # completions per rank in one optimizer step
        one_process = world_size == 1
        # Entropy selection wants every row in its quantile and (for exactness) one micro-batch as is.
        all_rows = a.top_entropy_quantile >= 1
        regroupable = one_process and all_rows and algo.rows_can_be_regrouped(a.loss_type)
        pack = o.pack_by_length and regroupable
        device = params[0].device.type if params else "cpu"
        compiled = one_process and (o.compile == "on" or (o.compile == "auto" and device in COMPILE_WINS_ON))
        skippable = (  # zero-advantage rows have a zero gradient (the adaptive bonus: in steps it does not apply)
            o.skip_zero_advantage
            and one_process
            and all_rows
            and algo.zero_advantage_rows_have_zero_gradient(
                loss_type=a.loss_type, beta=a.beta, entropy_coef=0.0 if a.adaptive_entropy else a.entropy_coef
            )
            # KL-Cov's term has a gradient on zero-advantage rows; Clip-Cov then draws over the rows that carry a signal
            and not a.kl_cov_ratio
        )
        return cls(
            world_size=world_size,
            prompts=r.prompts_per_step,
            group_size=r.group_size,
            micro_batch_size=min(o.micro_batch_size, minibatch) if o.micro_batch_size else minibatch,  # larger: one pass, noted
            steps_per_generation=o.steps_per_generation,
            shared_prefix=o.shared_prefix and one_process and not cfg.model.gradient_checkpointing and not compiled,
            compiled_forward=compiled,
            skip_zero_advantage=skippable and not a.adaptive_entropy,
            # one optimizer step per batch: the coefficient the step applies is known when its rows are chosen
            skip_while_no_bonus=skippable and a.adaptive_entropy and o.steps_per_generation == 1 and a.num_iterations == 1,
            pack_by_length=pack,
            packing_pieces=PACKING_PIECES if pack and not o.micro_batch_size else None,
            num_params=n,
            trainable_params=t,
            param_bytes=params[0].element_size() if params else 4,
            seq_len=prompt_tokens + r.max_new_tokens,
            completion_len=r.max_new_tokens,
            hidden=getattr(c, "hidden_size", 0) or 0,
            layers=getattr(c, "num_hidden_layers", 0) or 0,
            vocab=getattr(c, "vocab_size", 0) or 0,
            strategy=cfg.dist.strategy if world_size > 1 else "none",
            gradient_checkpointing=cfg.model.gradient_checkpointing,
        )

    @property
    def completions(self) -> int:
        return self.prompts * self.group_size

    @property
    def completions_per_rank(self) -> int:
        return self.completions // self.world_size

    @property
    def minibatch_per_rank(self) -> int:
        """Completions per rank in one optimizer step (the whole step's unless steps_per_generation > 1)."""
        return math.ceil(self.completions_per_rank / self.steps_per_generation)

    @property
    def accumulation_steps(self) -> int:
        """The most forward/backward passes one optimizer step runs per rank (fewer when rows are skipped)."""
        if self.packing_pieces:
            return min(self.packing_pieces, self.minibatch_per_rank)
        return math.ceil(self.minibatch_per_rank / self.micro_batch_size)

    def memory(self) -> dict[str, float]:
        """Bytes per rank: weights, gradients, AdamW state (2 fp32 moments), activations (rough)."""
        shard = self.world_size if self.strategy == "fsdp" else 1
        weights = self.num_params * self.param_bytes / shard
        grads = self.trainable_params * self.param_bytes / shard
        optim = self.trainable_params * 8 / shard
        tokens = self.micro_batch_size * self.seq_len
        # ~34 values per token per layer per hidden unit kept for backward (Korthikanti et al.,
        # without attention scores, which SDPA does not store); checkpointing keeps one per layer
        # plus one layer's worth. Logits: completion positions only, fp32, logits + softmax grad.
        per_layer = (1 if self.gradient_checkpointing else 34) * tokens * self.hidden * self.param_bytes
        act = per_layer * self.layers + (34 * tokens * self.hidden * self.param_bytes if self.gradient_checkpointing else 0)
        act += 3 * self.micro_batch_size * self.completion_len * self.vocab * 4
        return {"weights": weights, "gradients": grads, "optimizer": optim, "activations": act}

    def _fast_paths(self) -> str:
        notes = []
        if self.packing_pieces:
            notes.append(f"rows sorted by length into {self.packing_pieces} micro-batches when that computes fewer tokens")
        elif self.pack_by_length:
            notes.append("rows sorted by length when that computes fewer tokens")
        if self.skip_zero_advantage:
            notes.append("rows with advantage 0 skipped")
        if self.shared_prefix:
            notes.append("each prompt's forward shared by its group")
        if self.compiled_forward:
            notes.append("forward+backward compiled (torch.compile), lengths padded to buckets")
        return f" ({'; '.join(notes)})" if notes else ""

    def describe(self) -> str:
        mem = self.memory()
        total = sum(mem.values())
        lines = [
            f"batch plan: {self.prompts} prompts x {self.group_size} completions = {self.completions} completions per step",
            f"  {self.world_size} ranks ({self.strategy}): {self.prompts // self.world_size} prompts, "
            f"{self.completions_per_rank} completions per rank"
            if self.world_size > 1
            else "  one process (no torch.distributed)",
            *(
                [
                    f"  {self.steps_per_generation} minibatches of {self.minibatch_per_rank} completions per rank, "
                    "each its own optimizer step"
                ]
                if self.steps_per_generation > 1
                else []
            ),
            f"  micro-batch {self.micro_batch_size} completions -> "
            f"at most {self.accumulation_steps} forward/backward pass(es) per rank per update" + self._fast_paths(),
            f"  parameters {self.num_params / 1e6:.1f}M, trainable {self.trainable_params / 1e6:.2f}M"
            + (", gradient checkpointing on" if self.gradient_checkpointing else ""),
            "  memory per rank (estimate): " + ", ".join(f"{k} {_size(v)}" for k, v in mem.items()) + f"; total ~{_size(total)}",
        ]
        return "\n".join(lines)


def _size(b: float) -> str:
    for unit, div in (("GiB", GiB), ("MiB", 1024**2), ("KiB", 1024)):
        if b >= div:
            return f"{b / div:.1f} {unit}"
    return f"{b:.0f} B"
