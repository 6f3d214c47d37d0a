"""Hugging Face hub ids: telling them from local paths, finding them in the local cache, and a
quick check that the hub can be reached at all.

Without it, an id that is not cached on a machine without network spends about a minute in
huggingface_hub's retries before failing, and even a cached one waits through retries of
transformers' look-up of an adapter config; with it, the first fails with one line in seconds and
the second loads straight from its cached folder."""

from __future__ import annotations

import functools
import os
import re
import socket
import threading
import urllib.parse
from pathlib import Path

REACH_TIMEOUT_S = 3.0  # the whole reachability check (name lookup + TCP connect) stops after this

# `name` or `owner/name`: letters, digits, `-`, `_`, `.`; no leading `.`, no `..` (as the hub allows)
_HUB_ID = re.compile(r"^(?!\.)[\w.-]+(/(?!\.)[\w.-]+)?$")


def looks_like_hub_id(name: str) -> bool:
    """True for `owner/name` or `name`; False for anything only a path can be (`./x`, `/x`, `~/x`, `a/b/c`)."""
    return bool(_HUB_ID.match(name)) and ".." not in name


def is_cached(repo_id: str, repo_type: str = "model") -> bool:
    """Whether the local hub cache holds a snapshot of `repo_id`."""
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        return False
    folder = Path(HF_HUB_CACHE) / f"{repo_type}s--{repo_id.replace('/', '--')}" / "snapshots"
    return folder.is_dir() and any(folder.iterdir())


def cached_snapshot(repo_id: str, repo_type: str = "model") -> str:
    """The local folder of `repo_id`'s cached snapshot (its `main`), found without asking the hub."""
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id, repo_type=repo_type, local_files_only=True)


def offline_reason() -> str | None:
    """Why the hub cannot be used now (HF_HUB_OFFLINE set, or its host not reachable within
    REACH_TIMEOUT_S), or None when it can."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return "huggingface_hub is not installed"
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    return _unreachable(constants.ENDPOINT)


@functools.lru_cache(maxsize=4)
def _unreachable(endpoint: str) -> str | None:
    url = urllib.parse.urlsplit(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    proxy = (os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")) if url.scheme == "https" else None
    if proxy:  # behind a proxy only the proxy itself can be checked
        p = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = p.hostname or host, p.port or 80
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(f"{host}:{port} cannot be reached ({e.strerror or type(e).__name__})")

    # a thread, because a name lookup can hang past any socket timeout
    worker = threading.Thread(target=connect, name="rlvr-hub-check", daemon=True)
    worker.start()
    worker.join(REACH_TIMEOUT_S)
    return outcome[0] if outcome else f"{host}:{port} did not answer within {REACH_TIMEOUT_S:.0f} s"
