"""Data parallelism over torch.distributed: the only module of rlvr that touches it.

Launch with `torchrun --nproc_per_node N -m rlvr train ...` (or `rlvr train nproc=N`, which runs
torchrun itself). Each rank generates and scores its own whole groups of the step's prompts,
with the same weights; reward statistics, loss normalisers and metrics are reduced across ranks
so the update equals one process doing the whole batch. Gradients are summed across ranks by
DDP or reduce-scattered by FSDP2 (`fully_shard`), with gloo on CPU or nccl on GPU. Both are
tested on CPU/gloo against one process (tests/test_dist.py); neither has run on nccl yet.

FSDP2's forwards all-gather each layer's shards, so every rank must run the same number of
them: generation, the held-out eval and the reference log-probs (LoRA) gather the full weights
once on every rank (`full_weights_for_generation`), also on a rank with nothing to do.

Every collective runs under the process group's timeout (`dist.timeout`); a collective that
fails or times out raises `DistError` naming the ranks that stopped sending heartbeats (a
background thread on each rank writes one to the rendezvous store every second).

With one process (no torchrun environment) every function here is a cheap identity, and
torch.distributed is never initialised.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from datetime import timedelta

import torch


class DistError(RuntimeError):
    """A collective failed or timed out: a peer rank died or hangs. The message names it."""


class Dist:
    """This process's place in the job, and the collectives the trainer needs."""

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0, timeout: float = 600.0):
        self.rank, self.world_size, self.local_rank, self.timeout = rank, world_size, local_rank, timeout
        self.strategy = "none"
        self._store = None
        self._beat: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    # ------------------------------------------------------------------ set-up

    @classmethod
    def from_env(cls, *, backend: str = "auto", timeout: float = 600.0, device: torch.device | None = None) -> "Dist":
        """Join the job torchrun describes in the environment (RANK, WORLD_SIZE, MASTER_ADDR, ...);
        a plain single process when there is none."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls(timeout=timeout)
        import torch.distributed as td

        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if backend == "auto":
            backend = "nccl" if device is not None and device.type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        if not td.is_initialized():
            td.init_process_group(backend=backend, timeout=timedelta(seconds=timeout), rank=rank, world_size=world)
        d = cls(rank, world, local_rank, timeout)
        d._start_heartbeat()
        return d

    def _start_heartbeat(self) -> None:
        host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT")
        if not port:
            return
        try:
            self._store = torch.distributed.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
        except Exception:  # heartbeats only improve error messages; training does not need them
            self._store = None
            return

        def beat():
            while not self._stop.is_set():
                try:
                    self._store.set(f"rlvr/heartbeat/{self.rank}", str(time.time()))
                except Exception:
                    return
                self._stop.wait(1.0)

        self._beat = threading.Thread(target=beat, name="rlvr-heartbeat", daemon=True)
        self._beat.start()

    def close(self) -> None:
        self._stop.set()
        if self.enabled:
            import torch.distributed as td

            if td.is_initialized():
                td.destroy_process_group()

    def silent_ranks(self, stale_after: float = 3.0) -> list[int]:
        """Ranks whose heartbeat is older than `stale_after` seconds (or missing): dead or stuck."""
        if self._store is None:
            return []
        now, silent = time.time(), []
        for r in range(self.world_size):
            if r == self.rank:
                continue
            try:
                self._store.wait([f"rlvr/heartbeat/{r}"], timedelta(seconds=1))
                if now - float(self._store.get(f"rlvr/heartbeat/{r}")) > stale_after:
                    silent.append(r)
            except Exception:
                silent.append(r)
        return silent

    # ------------------------------------------------------------------ collectives

    def _run(self, what: str, fn):
        try:
            return fn()
        except Exception as e:  # gloo: "Connection closed by peer", timeouts; nccl: watchdog errors
            time.sleep(min(4.0, self.timeout))  # let a dead peer's heartbeat go stale
            silent = self.silent_ranks()
            who = f"rank(s) {silent} stopped responding" if silent else "a peer rank failed"
            raise DistError(
                f"rank {self.rank}: collective `{what}` failed: {who} (timeout dist.timeout={self.timeout:g}s). "
                f"The job stops; see that rank's output for its own error. Cause: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
            ) from e

    def all_reduce(self, t: torch.Tensor, op: str = "sum", what: str = "all_reduce") -> torch.Tensor:
        """In place and returned; op: sum, max or min."""
        if not self.enabled:
            return t
        import torch.distributed as td

        ops = {"sum": td.ReduceOp.SUM, "max": td.ReduceOp.MAX, "min": td.ReduceOp.MIN}
        self._run(what, lambda: td.all_reduce(t, op=ops[op]))
        return t

    def sum(self, *values: float, what: str = "sum") -> list[float]:
        """Sums of Python numbers across ranks (in float64)."""
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        return self.all_reduce(t, "sum", what).tolist()

    def max(self, value: float, what: str = "max") -> float:
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self._collective_device())
        return float(self.all_reduce(t, "max", what)[0])

    def min(self, value: float, what: str = "min") -> float:
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self._collective_device())
        return float(self.all_reduce(t, "min", what)[0])

    def all_gather_object(self, obj, what: str = "all_gather_object") -> list:
        """One picklable object from each rank, in rank order (small things: rewards, metrics)."""
        if not self.enabled:
            return [obj]
        import torch.distributed as td

        out = [None] * self.world_size
        self._run(what, lambda: td.all_gather_object(out, obj))
        return out

    def gather_object(self, obj, what: str = "gather_object") -> list | None:
        """Each rank's object, in rank order, on rank 0 only (None elsewhere)."""
        if not self.enabled:
            return [obj]
        import torch.distributed as td

        out = [None] * self.world_size if self.is_main else None
        self._run(what, lambda: td.gather_object(obj, out, dst=0))
        return out

    def barrier(self, what: str = "barrier") -> None:
        if not self.enabled:
            return
        import torch.distributed as td

        if td.get_backend() == "gloo":  # names the ranks that did not arrive
            self._run(what, lambda: td.monitored_barrier(timeout=timedelta(seconds=self.timeout), wait_all_ranks=True))
        else:
            self._run(what, lambda: td.barrier())

    def _collective_device(self) -> torch.device:
        import torch.distributed as td

        return torch.device("cuda", torch.cuda.current_device()) if td.get_backend() == "nccl" else torch.device("cpu")

    # ------------------------------------------------------------------ the data split

    def shard(self, n: int) -> slice:
        """This rank's share of n items: contiguous, sizes differing by at most one, rank order."""
        return slice(self.rank * n // self.world_size, (self.rank + 1) * n // self.world_size)

    # ------------------------------------------------------------------ model wrapping

    def wrap(self, model, strategy: str = "ddp"):
        """The module to train through: the model itself (one process), DDP, or FSDP2.

        DDP broadcasts rank 0's weights at construction, so every rank generates with the same
        weights. FSDP2 shards each decoder layer and the root in place (the returned object is
        `model` itself, now holding DTensor parameters). Build the optimizer after this."""
        if not self.enabled:
            return model
        self.strategy = strategy
        if strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.local_rank] if next(model.parameters()).device.type == "cuda" else None
            return DDP(model, device_ids=ids)
        if strategy == "fsdp":
            from torch.distributed.fsdp import fully_shard

            layers = getattr(getattr(model, "model", model), "layers", None)
            if layers is None:
                raise ValueError("dist.strategy=fsdp: the model has no `model.layers` list of decoder layers to shard; use ddp")
            for layer in layers:
                fully_shard(layer)
            fully_shard(model)
            return model
        raise ValueError(f"dist.strategy must be ddp or fsdp, got {strategy!r}")

    @contextlib.contextmanager
    def no_grad_sync(self, train_model, skip: bool):
        """Accumulate gradients locally (no communication) when `skip`: every micro-batch of a
        step but the last. The last micro-batch's backward then reduces the sum across ranks."""
        if not skip or not self.enabled:
            yield
        elif self.strategy == "ddp":
            with train_model.no_sync():
                yield
        elif self.strategy == "fsdp":
            train_model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                train_model.set_requires_gradient_sync(True)
        else:
            yield

    def full_model_state(self, model) -> dict | None:
        """FSDP2: the full (unsharded) weights on CPU, on rank 0 (empty on the others; a collective:
        call it on all ranks). None otherwise: the model's own state_dict is already whole."""
        if self.strategy != "fsdp":
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = self._run("gather weights", lambda: get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
        # Tied weights (lm_head = embed_tokens) come back as separate copies, which save_pretrained
        # would write twice; one tensor under both names again, as in an unsharded model's state_dict.
        first: dict[int, str] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            if id(p) in first and name in state and first[id(p)] in state:
                state[name] = state[first[id(p)]]
            first.setdefault(id(p), name)
        return state

    def full_optimizer_state(self, model, optimizer) -> dict | None:
        """FSDP2: the optimizer's full (unsharded) state on CPU, on rank 0 (empty on the others; a
        collective: call it on all ranks), in the layout one process's `optimizer.state_dict()` has
        (parameters numbered in optimizer order, not named), so any strategy can resume from it.
        None otherwise: `optimizer.state_dict()` is already whole."""
        if self.strategy != "fsdp":
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        named = self._run("gather optimizer state", lambda: get_optimizer_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
        if not self.is_main:
            return {}
        index = {name: i for i, name in enumerate(n for g in named["param_groups"] for n in g["params"])}
        return {
            "state": {index[name]: s for name, s in named["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in named["param_groups"]],
        }

    def load_full_model_state(self, model, state: dict, *, strict: bool = True) -> None:
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
        result = self._run("load weights", lambda: set_model_state_dict(
            model, state, options=StateDictOptions(full_state_dict=True, strict=strict)))
        if strict and (result.missing_keys or result.unexpected_keys):
            raise RuntimeError(f"resume: checkpoint does not match the model (missing {result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]})")

    def load_full_optimizer_state(self, model, optimizer, state: dict) -> None:
        """FSDP2: load an optimizer state in one process's layout (parameters numbered in optimizer
        order) that every rank read from a checkpoint; each rank keeps its shard (a collective)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        names = {id(p): n for n, p in model.named_parameters()}
        order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
        if len(order) != sum(len(g["params"]) for g in state["param_groups"]):
            raise RuntimeError(f"resume: the checkpoint's optimizer state has {sum(len(g['params']) for g in state['param_groups'])} "
                               f"parameters, the model trains {len(order)}")
        named = {
            "state": {order[i]: s for i, s in state["state"].items()},
            "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]],
        }
        self._run("load optimizer state", lambda: set_optimizer_state_dict(
            model, optimizer, named, options=StateDictOptions(full_state_dict=True)))

    @property
    def loss_scale(self) -> float:
        """DDP and FSDP average gradients over ranks; each rank's loss is already its share of the
        whole batch's loss (global normalisers), so scaling by world_size makes the average a sum."""
        return float(self.world_size)

    @contextlib.contextmanager
    def full_weights_for_generation(self, model):
        """FSDP2: keep every layer's full weights gathered while generating (each rank decodes a
        different number of steps, which per-forward all-gathers cannot survive). DDP: nothing."""
        if self.strategy != "fsdp":
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


def under_torchrun() -> bool:
    """True inside a process that torchrun (torch.distributed.run) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def launch_command(nproc: int, argv: list[str]) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc_per_node N -m rlvr <argv>`."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "rlvr", *argv]
