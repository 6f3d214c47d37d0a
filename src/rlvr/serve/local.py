"""A generation server in a child process on 127.0.0.1: what `rollout.max_staleness` > 0 runs
without `rollout.servers`, so one machine overlaps generation with training too."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rlvr.dist.transfer import free_port


class LocalServer:
    """`rlvr serve MODEL --engine hf` as a child process; stop() ends it (also at the trainer's exit)."""

    def __init__(
        self, model: str, *, device: str = "cpu", dtype: str = "float32", autocast: str = "none", timeout: float = 600.0, threads: int = 0
    ):
        """`threads`: the server's torch CPU threads (0: torch's default); the trainer's `threads` setting."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "rlvr", "serve", model, "--engine", "hf", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--device", device, "--dtype", dtype, "--autocast", autocast, "--timeout", str(timeout), "--exit-with", str(os.getpid())]
        cmd += ["--threads", str(threads)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def check_alive(self) -> None:
        """RuntimeError with the child's own error if it has exited."""
        if self.proc.poll() is not None:
            err = (self.proc.stderr.read() if self.proc.stderr else "")[-2000:]
            raise RuntimeError(f"the local generation server exited with status {self.proc.returncode}: {err.strip()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def wait_ready(self, seconds: float) -> None:
        from rlvr.rollout.engines.remote.client import call_json
        from rlvr.rollout.engines.remote.protocol import ServerError

        deadline = time.monotonic() + seconds
        while True:
            self.check_alive()
            try:
                call_json(self.url, "/health", None, token=None, timeout=5)
                return
            except ServerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
