"""The servers a trainer generates on: requests spread across them, dead ones dropped.

A request's prompts are split into contiguous shares, one per live server (data-parallel
generation), sent at once from threads. A server that fails (refused, reset, timed out, an error
answer) is dropped for the rest of the run and its share is sent again to the others, with the
same seeds: the rows it owed are regenerated, not lost. With none left, NoServersLeft names them.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rlvr.rollout.engines.remote.protocol import GenerateRequest, Sample, ServerClient, ServerError


class NoServersLeft(ServerError):
    """Every generation server of the run has failed."""


@dataclass
class PoolStats:
    rows: dict[str, int] = field(default_factory=dict)  # url -> prompts served since the last take()
    dropped: list[str] = field(default_factory=list)  # urls dropped since the last take()
    regenerated: int = 0  # prompts sent again after their server failed


class ServerPool:
    def __init__(self, clients: list[ServerClient]):
        if not clients:
            raise ValueError("a server pool needs at least one server")
        self.alive: list[ServerClient] = list(clients)
        self.failures: dict[str, str] = {}  # url -> why it was dropped
        self.stats = PoolStats()
        self._lock = threading.Lock()

    def drop(self, client: ServerClient, error: Exception) -> None:
        with self._lock:
            if client in self.alive:
                self.alive.remove(client)
                self.failures[client.url] = str(error)
                self.stats.dropped.append(client.url)

    def live(self) -> list[ServerClient]:
        with self._lock:
            if not self.alive:
                why = "; ".join(f"{u}: {e}" for u, e in self.failures.items())
                raise NoServersLeft(", ".join(self.failures), f"no generation server is left ({why})")
            return list(self.alive)

    def take_stats(self) -> PoolStats:
        with self._lock:
            stats, self.stats = self.stats, PoolStats()
        return stats

    def generate(self, request: GenerateRequest) -> tuple[list[list[Sample]], list[int]]:
        """(samples [B][n], the weight version of each prompt's samples [B]); every prompt served by some live server."""
        B = len(request.prompt_ids)
        samples: list[list[Sample] | None] = [None] * B
        versions = [0] * B
        todo = list(range(B))
        while todo:
            servers = self.live()
            shares = _split(todo, len(servers))
            with ThreadPoolExecutor(len(shares)) as ex:
                futures = [(s, idx, ex.submit(s.generate, request.rows(idx))) for s, idx in zip(servers, shares) if idx]
            failed: list[int] = []
            for server, idx, fut in futures:
                try:
                    result = fut.result()
                except ServerError as e:
                    if e.refused_request:
                        raise
                    self.drop(server, e)
                    failed += idx
                    continue
                for i, per in zip(idx, result.samples):
                    samples[i], versions[i] = per, result.version
                with self._lock:
                    self.stats.rows[server.url] = self.stats.rows.get(server.url, 0) + len(idx)
            with self._lock:
                self.stats.regenerated += len(failed)
            todo = sorted(failed)
        return [s for s in samples if s is not None], versions


def _split(idx: list[int], parts: int) -> list[list[int]]:
    """`idx` in `parts` contiguous shares whose sizes differ by at most one."""
    q, r = divmod(len(idx), parts)
    out, start = [], 0
    for p in range(parts):
        n = q + (p < r)
        out.append(idx[start : start + n])
        start += n
    return out
