"""The batch plan: how a step's prompts and completions split across ranks and micro-batches,
and a rough memory estimate per rank. Printed at start-up; impossible splits are refused with
the setting to change and a value that works."""

from __future__ import annotations

import math
from dataclasses import dataclass

GiB = 1024**3


def batch_split_errors(cfg, world_size: int) -> list[str]:
    """Problems with splitting cfg's batch over `world_size` ranks, each naming what to change."""
    r, o, a = cfg.rollout, cfg.optim, cfg.algo
    errors = []
    P, G, W = r.prompts_per_step, r.group_size, world_size
    if P < 1 or G < 1:
        return errors  # reported elsewhere
    if P % W:
        up, down = math.ceil(P / W) * W, max(d for d in range(1, W + 1) if P % d == 0)
        errors.append(
            f"`rollout.prompts_per_step`={P} does not split over {W} ranks (each group of {G} completions stays whole on one rank): "
            f"set rollout.prompts_per_step to a multiple of {W} (e.g. {up}), or nproc to {down}"
        )
    per_rank = P * G // W if P % W == 0 else math.ceil(P / W) * G
    if o.micro_batch_size > 0 and o.micro_batch_size > per_rank:
        where = f"per rank ({P} prompts x {G} completions / {W} ranks)" if W > 1 else "per step (rollout.prompts_per_step x rollout.group_size)"
        errors.append(
            f"`optim.micro_batch_size`={o.micro_batch_size} is larger than the {per_rank} completions {where}; "
            f"set it to at most {per_rank}, or 0"
        )
    if W > 1 and a.top_entropy_quantile < 1:
        errors.append(
            f"`algo.top_entropy_quantile`={a.top_entropy_quantile} picks tokens by a whole-batch quantile, which is not reduced across ranks yet: "
            "set it to 1.0, or nproc to 1"
        )
    return errors


@dataclass
class BatchPlan:
    world_size: int
    prompts: int
    group_size: int
    micro_batch_size: int  # completions per forward/backward (per rank)
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
        params = list(model.parameters())
        c = getattr(model, "config", None)
        n = sum(p.numel() for p in {id(p): p for p in params}.values())
        t = sum(p.numel() for p in {id(p): p for p in params if p.requires_grad}.values())
        per_rank = cfg.rollout.completions_per_step // world_size
        return cls(
            world_size=world_size,
            prompts=cfg.rollout.prompts_per_step,
            group_size=cfg.rollout.group_size,
            micro_batch_size=cfg.optim.micro_batch_size or per_rank,
            num_params=n,
            trainable_params=t,
            param_bytes=params[0].element_size() if params else 4,
            seq_len=prompt_tokens + cfg.rollout.max_new_tokens,
            completion_len=cfg.rollout.max_new_tokens,
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
    def accumulation_steps(self) -> int:
        return math.ceil(self.completions_per_rank / self.micro_batch_size)

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

    def describe(self) -> str:
        mem = self.memory()
        total = sum(mem.values())
        lines = [
            f"batch plan: {self.prompts} prompts x {self.group_size} completions = {self.completions} completions per step",
            f"  {self.world_size} rank(s) ({self.strategy}): {self.prompts // self.world_size} prompts, {self.completions_per_rank} completions per rank",
            f"  micro-batch {self.micro_batch_size} completions -> {self.accumulation_steps} accumulation step(s) per rank per update",
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
