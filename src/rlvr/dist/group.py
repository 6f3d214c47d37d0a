"""The process group: this process's rank in the job torchrun started, the collectives the trainer runs
(each named, so a failure says which), heartbeats that name a dead rank, and launching through torchrun.

Every collective runs under the process group's timeout (`dist.timeout`); a collective that
fails or times out raises `DistError` naming the ranks that stopped sending heartbeats (a
background thread on each rank writes one to the rendezvous store every second).

With one process (no torchrun environment) every collective is a cheap identity, and
torch.distributed is never initialised.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import torch


class DistError(RuntimeError):
    """A collective failed or timed out: a peer rank died or hangs. The message names it."""


class Dist:
    """This process's place in the job, how the job splits the model (`strategy`, fixed when the job is
    joined: `ddp`, `fsdp`, or `none` for one process), and the collectives the trainer needs."""

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0, timeout: float = 600.0, strategy: str = "none"):
        self.rank, self.world_size, self.local_rank, self.timeout = rank, world_size, local_rank, timeout
        self.strategy = strategy if world_size > 1 else "none"
        self._store: torch.distributed.TCPStore | None = None
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
    def from_env(
        cls, *, backend: str = "auto", timeout: float = 600.0, device: torch.device | None = None, strategy: str = "ddp"
    ) -> "Dist":
        """Join the job torchrun describes in the environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), its ranks
        splitting the model by `strategy` (dist.strategy); a plain single process when there is none."""
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
        d = cls(rank, world, local_rank, timeout, strategy)
        d._start_heartbeat()
        return d

    def _start_heartbeat(self) -> None:
        host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT")
        if not port:
            return
        try:
            self._store = store = torch.distributed.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
        except Exception:  # heartbeats only improve error messages; training does not need them
            self._store = None
            return

        def beat():
            while not self._stop.is_set():
                try:
                    store.set(f"rlvr/heartbeat/{self.rank}", str(time.time()))
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

    def run(self, what: str, fn):
        """`fn()`, a collective named `what`; its failure is a DistError naming the ranks that went silent."""
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
        self.run(what, lambda: td.all_reduce(t, op=ops[op]))
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
        self.run(what, lambda: td.all_gather_object(out, obj))
        return out

    def gather_object(self, obj, what: str = "gather_object") -> list | None:
        """Each rank's object, in rank order, on rank 0 only (None elsewhere)."""
        if not self.enabled:
            return [obj]
        import torch.distributed as td

        out = [None] * self.world_size if self.is_main else None
        self.run(what, lambda: td.gather_object(obj, out, dst=0))
        return out

    def barrier(self, what: str = "barrier") -> None:
        if not self.enabled:
            return
        import torch.distributed as td

        if td.get_backend() == "gloo":  # names the ranks that did not arrive
            self.run(what, lambda: td.monitored_barrier(timeout=timedelta(seconds=self.timeout), wait_all_ranks=True))
        else:
            self.run(what, lambda: td.barrier())

    def _collective_device(self) -> torch.device:
        import torch.distributed as td

        return torch.device("cuda", torch.cuda.current_device()) if td.get_backend() == "nccl" else torch.device("cpu")

    # ------------------------------------------------------------------ the data split

    def shard(self, n: int) -> slice:
        """This rank's share of n items: contiguous, sizes differing by at most one, rank order."""
        return slice(self.rank * n // self.world_size, (self.rank + 1) * n // self.world_size)


def initialized_world_size() -> int:
    """Ranks in this process's initialised process group; 1 when none is (one process, or not joined yet)."""
    import torch.distributed as td

    return td.get_world_size() if td.is_available() and td.is_initialized() else 1


def under_torchrun() -> bool:
    """True inside a process that torchrun (torch.distributed.run) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def launch_command(nproc: int, argv: list[str]) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc_per_node N -m rlvr <argv>`."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "rlvr", *argv]
