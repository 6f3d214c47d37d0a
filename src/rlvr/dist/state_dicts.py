"""Full (unsharded) state dicts of an FSDP2-sharded model and its optimizer: gathered onto rank 0 for a
checkpoint, written exactly as one process writes them, and loaded back into shards on every rank, so a
checkpoint resumes under any strategy and number of ranks. Each function is a collective (every rank
calls it); with DDP or one process there is nothing to gather (None: the model's own state is whole).
"""

from __future__ import annotations

from typing import Any

from rlvr.dist.group import Dist


def full_model_state(dist: Dist, model) -> dict | None:
    """FSDP2: the full (unsharded) weights on CPU, on rank 0 (empty on the others; a collective:
    call it on all ranks). None otherwise: the model's own state_dict is already whole."""
    if dist.strategy != "fsdp":
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = dist.run("gather weights", lambda: get_model_state_dict(model, options=options))
    # Tied weights (lm_head = embed_tokens) come back as separate copies, which save_pretrained
    # would write twice; one tensor under both names again, as in an unsharded model's state_dict.
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first and name in state and first[id(p)] in state:
            state[name] = state[first[id(p)]]
        first.setdefault(id(p), name)
    return state


def full_optimizer_state(dist: Dist, model, optimizer) -> dict | None:
    """FSDP2: the optimizer's full (unsharded) state on CPU, on rank 0 (empty on the others; a
    collective: call it on all ranks), in the layout one process's `optimizer.state_dict()` has
    (parameters numbered in optimizer order, not named), so any strategy can resume from it.
    None otherwise: `optimizer.state_dict()` is already whole."""
    if dist.strategy != "fsdp":
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    named = dist.run(
        "gather optimizer state",
        lambda: get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)),
    )
    if not dist.is_main:
        return {}
    index = {name: i for i, name in enumerate(n for g in named["param_groups"] for n in g["params"])}
    return {
        "state": {index[name]: s for name, s in named["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in named["param_groups"]],
    }


def load_full_model_state(dist: Dist, model, state: dict, *, strict: bool = True) -> None:
    """FSDP2: load full (unsharded) weights that every rank read from a checkpoint; each rank
    keeps its shard (a collective: call it on all ranks). Names missing from `state` that are
    tied to a name in it (lm_head = embed_tokens, written once) take that tensor."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    state = dict(state)
    by_param: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_param.setdefault(id(p), []).append(name)
    for names in by_param.values():
        present = [n for n in names if n in state]
        for n in names:
            if present and n not in state:
                state[n] = state[present[0]]
    result = dist.run(
        "load weights", lambda: set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=strict))
    )
    if strict and (result.missing_keys or result.unexpected_keys):
        raise RuntimeError(
            f"resume: checkpoint does not match the model (missing {result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]})"
        )


def load_full_optimizer_state(dist: Dist, model, optimizer, state: dict) -> None:
    """FSDP2: load an optimizer state in one process's layout (parameters numbered in optimizer
    order) that every rank read from a checkpoint; each rank keeps its shard (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    if len(order) != sum(len(g["params"]) for g in state["param_groups"]):
        raise RuntimeError(
            f"resume: the checkpoint's optimizer state has {sum(len(g['params']) for g in state['param_groups'])} "
            f"parameters, the model trains {len(order)}"
        )
    named: dict[str, Any] = {
        "state": {order[i]: s for i, s in state["state"].items()},
        "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]],
    }
    dist.run(
        "load optimizer state", lambda: set_optimizer_state_dict(model, optimizer, named, options=StateDictOptions(full_state_dict=True))
    )
