"""Generation apart from training, the trainer's side of it: the RemoteEngine over `rollout.servers`
(or, for max_staleness > 0 without servers, over a local generation process rank 0 starts), and the
AheadSource that overlaps the next steps' generation with this step's update."""

from __future__ import annotations

import atexit
import os
import socket
from urllib.parse import urlparse

from rlvr.config import ConfigError
from rlvr.rollout.engines.remote.client import make_client
from rlvr.rollout.engines.remote.protocol import ServerError
from rlvr.rollout.engines.remote.engine import RemoteEngine
from rlvr.rollout.engines.remote.pool import ServerPool
from rlvr.serve import LOOPBACK, TOKEN_ENV
from rlvr.serve.local import LocalServer
from rlvr.training.ahead import AheadSource
from rlvr.training.step_metrics import staleness_metrics

STARTUP_WAIT_S = 180.0


def uses_servers(cfg) -> bool:
    return bool(cfg.rollout.servers) or cfg.rollout.max_staleness > 0


def server_urls(cfg, dist, *, device, precision: str) -> tuple[list[str], LocalServer | None]:
    """rollout.servers, or the local generation process rank 0 starts (its URL shared with every rank)."""
    if cfg.rollout.servers:
        return list(cfg.rollout.servers), None
    local = None
    if dist.is_main:
        local = LocalServer(
            cfg.model.path, device=str(device), dtype=cfg.model.dtype, autocast=precision, timeout=cfg.dist.timeout, threads=cfg.threads
        )
        atexit.register(local.stop)
        local.wait_ready(STARTUP_WAIT_S)
    url = local.url if local is not None else None
    if dist.enabled:  # rank 0's, on every rank
        url = dist.all_gather_object(url, what="the local generation server")[0]
    assert url is not None, "rank 0 started it"
    return [url], local


def remote_engine(cfg, model, tokenizer, dist, *, version_of, device, precision: str) -> tuple[RemoteEngine, LocalServer | None]:
    urls, local = server_urls(cfg, dist, device=device, precision=precision)
    r, token = cfg.rollout, os.environ.get(TOKEN_ENV)
    wait = min(STARTUP_WAIT_S, r.server_timeout_s)
    try:
        clients = [make_client(u, token=token, timeout=r.server_timeout_s, wait=wait) for u in urls]
    except ServerError as e:
        raise ConfigError(f"rollout.servers: {e} (waited {wait:g}s); start it with `rlvr serve MODEL --port PORT` or fix the URL") from None
    loopback = all(urlparse(u).hostname in LOOPBACK for u in urls)
    host = r.trainer_host or ("127.0.0.1" if loopback else socket.getfqdn())
    engine = RemoteEngine(
        model,
        tokenizer,
        ServerPool(clients),
        dist=dist,
        version_of=version_of,
        weight_sync=r.weight_sync,
        weight_dir=r.weight_dir,
        trainer_host=host,
        timeout=min(cfg.dist.timeout, r.server_timeout_s),
        # Servers on this host (the local one always) may share the trainer's GPU, which NCCL refuses in one group:
        # gloo through host memory. Servers on other hosts: NCCL when the trainer is on a GPU.
        transfer_backend="gloo" if loopback else None,
    )
    return engine, local


class GenerationApart:
    """What a trainer with generation servers holds besides its engine: the local server it started (if any) and the
    AheadSource of max_staleness > 0 (if any)."""

    def __init__(self, cfg, engine: RemoteEngine, local: LocalServer | None, dist):
        self.cfg, self.engine, self.local, self.dist = cfg, engine, local, dist
        self.ahead: AheadSource | None = None
        self._told: set[str] = set()  # dropped servers already reported

    @classmethod
    def start_servers(cls, cfg, trainer) -> "GenerationApart":
        """Reach rollout.servers (or start the local one) for `trainer` (its model, tokenizer, dist, device, precision).
        The weight version is the trainer's step: the updates applied so far."""
        t = trainer
        engine, local = remote_engine(
            cfg, t.model, t.tokenizer, t.dist, version_of=lambda: t.state.step, device=t.device, precision=t.precision.autocast
        )
        return cls(cfg, engine, local, t.dist)

    def ahead_of(self, source, stream, collector):
        """The source the collect phase reads: `source` itself, or with max_staleness > 0 an AheadSource over it."""
        if self.cfg.rollout.max_staleness == 0:
            return source
        self.ahead = AheadSource(
            source,
            stream,
            max_staleness=self.cfg.rollout.max_staleness,
            prompts_per_step=self.cfg.rollout.prompts_per_step,
            seeds_of=collector.seeds_of,
            share=self.dist.shard if self.dist.enabled else (lambda n: slice(0, n)),
            weights_version=lambda: self.engine.version,
        )
        return self.ahead

    def start(self, source, step: int, position: int) -> None:
        """The servers get the trainer's weights (unless a resume just sent them); rollouts ahead start from the stream's
        position (after a resume the killed run's in-flight rollouts are made again)."""
        if self.engine.version is None:
            source.sync_weights()
        if self.ahead is not None:
            self.ahead.start(step, position)

    def after_collect(self, next_step: int, position: int) -> None:
        if self.ahead is not None:
            self.ahead.after_collect(next_step, position)

    def metrics(self, batch, trained_version: int) -> dict[str, float]:
        return {**server_metrics(self.engine, self.ahead), **staleness_metrics(batch, trained_version)}

    def notes(self) -> list[str]:
        """A warning for each server dropped since the last call, naming it and why."""
        failures = self.engine.pool.failures
        new = [u for u in failures if u not in self._told]
        self._told |= set(new)
        left = len(self.engine.pool.alive)
        return [f"[warning] generation server dropped ({left} left; its rows were made again elsewhere): {failures[u]}" for u in new]

    def close(self) -> None:
        """Stop the rollouts-ahead thread and the local server."""
        if self.ahead is not None:
            self.ahead.close()
        if self.local is not None:
            self.local.stop()


def server_metrics(engine: RemoteEngine, ahead: AheadSource | None) -> dict[str, float]:
    """This step's weight-sync, server-share and overlap metrics (counters reset each step)."""
    stats, sync = engine.pool.take_stats(), engine.take_sync_stats()
    total = sum(stats.rows.values()) or 1
    out = {"weight_sync/seconds": sync.seconds, "weight_sync/bytes": float(sync.bytes), "servers/alive": float(len(engine.pool.alive))}
    out.update({f"servers/share/{urlparse(u).netloc}": n / total for u, n in sorted(stats.rows.items())})
    if stats.dropped or stats.regenerated:
        out.update({"servers/dropped": float(len(stats.dropped)), "servers/regenerated_prompts": float(stats.regenerated)})
    if ahead is not None:
        a = ahead.take_stats()
        out.update({"time/waiting_for_rollouts": a.waited_for_rollouts, "time/generator_waiting_for_weights": a.waited_for_weights})
        out["rollout/made_ahead"] = float(a.made_ahead)
    return out
