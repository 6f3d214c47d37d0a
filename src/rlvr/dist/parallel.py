"""Parallel wrapping: the model trained through DDP or FSDP2 (`fully_shard`) per `dist.strategy`, and what
the wrapping changes for the loop: when gradients are reduced, how losses are scaled, how generation
gathers FSDP2's shards.

Gradients are summed across ranks by DDP or reduce-scattered by FSDP2, with gloo on CPU or nccl on
GPU. FSDP2's forwards all-gather each layer's shards, so every rank must run the same number of
them: generation, the held-out eval and the reference log-probs (LoRA) gather the full weights
once on every rank (`full_weights_for_generation`), also on a rank with nothing to do.
"""

from __future__ import annotations

import contextlib

from rlvr.dist.group import Dist


def wrap(dist: Dist, model):
    """The module to train through: the model itself (one process), DDP, or FSDP2, as `dist.strategy`
    (fixed when the job was joined) says; `dist` is not changed.

    DDP broadcasts rank 0's weights at construction, so every rank generates with the same
    weights. FSDP2 shards each decoder layer and the root in place (the returned object is
    `model` itself, now holding DTensor parameters). Build the optimizer after this."""
    if not dist.enabled:
        return model
    if dist.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [dist.local_rank] if next(model.parameters()).device.type == "cuda" else None
        return DDP(model, device_ids=ids)
    if dist.strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        layers = getattr(getattr(model, "model", model), "layers", None)
        if layers is None:
            raise ValueError("dist.strategy=fsdp: the model has no `model.layers` list of decoder layers to shard; use ddp")
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    raise ValueError(f"dist.strategy must be ddp or fsdp, got {dist.strategy!r}")


@contextlib.contextmanager
def no_grad_sync(dist: Dist, train_model, skip: bool):
    """Accumulate gradients locally (no communication) when `skip`: every micro-batch of a
    step but the last. The last micro-batch's backward then reduces the sum across ranks."""
    if not skip or not dist.enabled:
        yield
    elif dist.strategy == "ddp":
        with train_model.no_sync():
            yield
    elif dist.strategy == "fsdp":
        train_model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            train_model.set_requires_gradient_sync(True)
    else:
        yield


def loss_scale(dist: Dist) -> float:
    """DDP and FSDP average gradients over ranks; each rank's loss is already its share of the
    whole batch's loss (global normalisers), so scaling by world_size makes the average a sum."""
    return float(dist.world_size)


@contextlib.contextmanager
def full_weights_for_generation(dist: Dist, model):
    """FSDP2: keep every layer's full weights gathered while generating (each rank decodes a
    different number of steps, which per-forward all-gathers cannot survive). DDP: nothing."""
    if dist.strategy != "fsdp":
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in mods:
        m.unshard()
        m.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for m in mods:
            m.set_reshard_after_forward(True)
            m.reshard()
