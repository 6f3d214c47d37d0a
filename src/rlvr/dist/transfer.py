"""Weights from the trainer to a generation server over torch.distributed: NCCL between GPUs, gloo
on CPUs, one code path.

Each server gets its own two-process group (the trainer's rank 0 is rank 0, the server rank 1),
made from a TCPStore the trainer hosts, outside torch.distributed's default group: the trainer's
own ranks (torchrun) and the servers never share a group, and a server that dies breaks only its
own pair, never the others' syncs. A sync is one broadcast per bucket: the tensors of one dtype
are packed into flat buffers of at most `bucket_bytes` (a few large messages, not one per
parameter). The receiver stages everything it receives in fresh tensors and hands them over only
once the last bucket has arrived, so a sync cut midway leaves the server on its old weights.

The list of tensors (names, dtypes, shapes, in order) travels beside the broadcast, over the
server's HTTP API (rlvr.serve): both sides pack and unpack by it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable, Sequence

import torch
import torch.distributed as td

BUCKET_BYTES = 256 * 2**20


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # e.g. "float32", as torch.<dtype> names it
    shape: tuple[int, ...]

    @staticmethod
    def of(name: str, t: torch.Tensor) -> "TensorMeta":
        return TensorMeta(name, str(t.dtype).removeprefix("torch."), tuple(t.shape))

    def as_json(self) -> list:
        return [self.name, self.dtype, list(self.shape)]

    @staticmethod
    def from_json(x: Sequence) -> "TensorMeta":
        name, dtype, shape = x
        return TensorMeta(str(name), str(dtype), tuple(int(s) for s in shape))

    @property
    def torch_dtype(self) -> torch.dtype:
        dt = getattr(torch, self.dtype, None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"weight {self.name}: unknown dtype {self.dtype!r}")
        return dt

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def backend_for(device: torch.device | str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def _pair_group(host: str, port: int, rank: int, backend: str, timeout: float, device: torch.device):
    store = td.TCPStore(host, port, 2, is_master=rank == 0, timeout=timedelta(seconds=timeout))
    prefixed = td.PrefixStore("rlvr-weights", store)
    if backend == "nccl":  # pragma: no cover - needs two GPUs' worth of processes; bench/gpu.sh runs it
        opts = td.ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=timeout)
        torch.cuda.set_device(device)
        return store, td.ProcessGroupNCCL(prefixed, rank, 2, opts)
    if backend != "gloo":
        raise ValueError(f"weight transfer backend must be gloo or nccl, got {backend!r}")
    return store, td.ProcessGroupGloo(prefixed, rank, 2, timedelta(seconds=timeout))


def buckets(metas: Sequence[TensorMeta], bucket_bytes: int = BUCKET_BYTES) -> list[list[int]]:
    """Indices of `metas` grouped into broadcasts: consecutive tensors of one dtype, each group at most
    bucket_bytes (a larger tensor goes alone). Both sides compute the same from the same list."""
    out: list[list[int]] = []
    size, dtype = 0, None
    for i, m in enumerate(metas):
        nbytes = m.numel * m.torch_dtype.itemsize
        if out and m.dtype == dtype and size + nbytes <= bucket_bytes:
            out[-1].append(i)
            size += nbytes
        else:
            out.append([i])
            size, dtype = nbytes, m.dtype
    return out


class _Pair:
    def __init__(self, host: str, port: int, rank: int, backend: str, timeout: float, device: torch.device | str):
        # gloo moves CPU tensors (a GPU's weights are copied through host memory): the one way between two
        # processes on one GPU, where NCCL refuses a group whose ranks share a device
        self.device = torch.device(device) if backend == "nccl" else torch.device("cpu")
        self.store, self.group = _pair_group(host, port, rank, backend, timeout, self.device)

    def broadcast(self, t: torch.Tensor) -> None:
        opts = td.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([t], opts).wait()

    def close(self) -> None:
        self.group, self.store = None, None


class WeightSender(_Pair):
    """The trainer's end of one server's pair group (rank 0, hosting the store on `port`)."""

    def __init__(self, host: str, port: int, *, backend: str = "gloo", timeout: float = 600.0, device: torch.device | str = "cpu"):
        super().__init__(host, port, 0, backend, timeout, device)

    def send(self, tensors: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES) -> int:
        """Broadcast the tensors in order (their metas, TensorMeta.of, went to the receiver first); -> bytes sent."""
        metas = [TensorMeta.of(n, t) for n, t in tensors]
        sent = 0
        for idx in buckets(metas, bucket_bytes):
            flat = torch.cat([tensors[i][1].detach().reshape(-1).to(self.device) for i in idx])
            self.broadcast(flat)
            sent += flat.numel() * flat.element_size()
        return sent


class WeightReceiver(_Pair):
    """A server's end of its pair group (rank 1, joining the trainer's store)."""

    def __init__(self, host: str, port: int, *, backend: str = "gloo", timeout: float = 600.0, device: torch.device | str = "cpu"):
        super().__init__(host, port, 1, backend, timeout, device)

    def receive(self, metas: Sequence[TensorMeta], bucket_bytes: int = BUCKET_BYTES) -> dict[str, torch.Tensor]:
        """Every tensor of `metas`, in fresh memory; an exception (and nothing returned) when the sync breaks off."""
        out: dict[str, torch.Tensor] = {}
        for idx in buckets(metas, bucket_bytes):
            dtype = metas[idx[0]].torch_dtype
            flat = torch.empty(sum(metas[i].numel for i in idx), dtype=dtype, device=self.device)
            self.broadcast(flat)
            offset = 0
            for i in idx:
                m = metas[i]
                out[m.name] = flat[offset : offset + m.numel].view(m.shape)
                offset += m.numel
        return out


def metas_of(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[TensorMeta]:
    return [TensorMeta.of(n, t) for n, t in tensors]
