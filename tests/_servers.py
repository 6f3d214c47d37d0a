"""Generation servers for tests: `python -m rlvr serve` subprocesses on 127.0.0.1, started on free ports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

from rlvr.dist.transfer import free_port


class Server:
    def __init__(self, model: str, *args: str, host: str = "127.0.0.1", env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "rlvr", "serve", model, "--host", host, "--port", str(self.port), *args]
        self.proc = subprocess.Popen(
            cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def wait(self, timeout: float = 60.0) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rlvr serve exited {self.proc.returncode}: {self.proc.stdout.read() if self.proc.stdout else ''}")
            try:
                self.health()
                return self
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"{self.url} did not answer /health in {timeout}s")

    def health(self) -> dict:
        with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
            return json.loads(r.read())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def start_servers(model: str, n: int, *args: str) -> list[Server]:
    servers = [Server(model, *args) for _ in range(n)]
    return [s.wait() for s in servers]
