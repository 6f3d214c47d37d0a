"""bench/gpu_paths.py's agent: one chat call over plain urllib (the GPU machine has no `openai` package);
reward 1 when the reply holds the row's answer."""

from __future__ import annotations

import json
import urllib.request


def agent(row: dict, base_url: str, model: str, api_key: str) -> float:
    prompt = row["prompt"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    body = json.dumps({"model": model, "messages": messages, "max_tokens": 8, "temperature": 1.0}).encode()
    req = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(req, timeout=120) as r:
        reply = json.loads(r.read())["choices"][0]["message"].get("content") or ""
    return float(str(row["answer"]) in reply)
