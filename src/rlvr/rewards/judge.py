"""LLM-as-judge reward over an OpenAI-compatible chat-completions endpoint.

    fn: "judge(url='http://127.0.0.1:8000/v1', model='qwen2.5-7b-instruct', max_score=10)"

Each completion is sent, inside `prompt_template` (fields: {prompt}, {completion} and any
dataset column, e.g. {answer}), as one user message; the score is the last match of
`score_pattern` in the judge's reply, divided by `max_score` and clipped to [0, 1]. Requests
run in parallel (`max_workers`), each with `timeout_s` and `retries` (with backoff); a sample
whose judge never answers usably gets None and the failure is logged. An API key, if needed,
is read from the environment variable named by `api_key_env`.

Known hack guarded: a completion cannot close the template's <response> block or forge the
judge's reply format (the tags are stripped from it). A judge is still a model: prompt
injection is mitigated, not impossible; prefer programmatic graders where they exist.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from rlvr.rewards.factory import named, reward_factory
from rlvr.rewards.text import completion_text

log = logging.getLogger("rlvr.rewards")

DEFAULT_TEMPLATE = (
    "You are grading an answer. Question:\n{prompt}\n\nAnswer to grade:\n<response>\n{completion}\n</response>\n\n"
    "Judge correctness and quality. Reply with one line `Score: N` where N is an integer from 0 to 10."
)
DEFAULT_SCORE_PATTERN = r"[Ss]core\s*[:=]\s*(-?\d+(?:\.\d+)?)"


def _prompt_text(prompt) -> str:
    """A prompt as text: chat messages (any role) joined, or the string itself."""
    if isinstance(prompt, (list, tuple)):
        return "\n".join(str(m.get("content") or "") for m in prompt if isinstance(m, dict))
    return "" if prompt is None else str(prompt)


class _Fields(dict):
    def __missing__(self, key):  # a template field the row does not have renders empty
        return ""


def _endpoint(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"judge: url must be http(s)://..., got {url!r}")
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def parse_score(reply: str, pattern: str, max_score: float) -> float | None:
    found = re.findall(pattern, reply)
    if not found:
        return None
    try:
        value = float(found[-1] if isinstance(found[-1], str) else found[-1][0])
    except ValueError:
        return None
    return min(1.0, max(0.0, value / max_score))


@reward_factory
def judge(
    url: str | None = None,
    model: str | None = None,
    prompt_template: str = DEFAULT_TEMPLATE,
    score_pattern: str = DEFAULT_SCORE_PATTERN,
    max_score: float = 10.0,
    timeout_s: float = 60.0,
    retries: int = 2,
    max_workers: int = 8,
    temperature: float = 0.0,
    api_key_env: str = "OPENAI_API_KEY",
):
    """Build an LLM-judge reward. `url` and `model` are required."""
    if not url or not model:
        raise ValueError("judge needs a url and a model, e.g. fn: \"judge(url='http://127.0.0.1:8000/v1', model='m')\"")
    endpoint = _endpoint(url)

    def ask(text: str) -> float | None:
        body = json.dumps({"model": model, "temperature": temperature, "messages": [{"role": "user", "content": text}]}).encode()
        headers = {"Content-Type": "application/json"}
        if os.environ.get(api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[api_key_env]}"
        last_error = "no attempt"
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(min(2.0, 0.1 * 2**attempt))
            try:
                req = urllib.request.Request(endpoint, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                    reply = json.loads(resp.read())["choices"][0]["message"]["content"]
                score = parse_score(str(reply), score_pattern, max_score)
                if score is not None:
                    return score
                last_error = f"no score in reply {str(reply)[:200]!r}"
            except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
                last_error = f"{type(e).__name__}: {e}"
        log.warning("judge: giving up on a sample after %d attempts: %s", retries + 1, last_error)
        return None

    def reward(prompts, completions, **columns):
        texts = []
        for i, c in enumerate(completions):
            answer = re.sub(r"</?response>", "", completion_text(c))
            fields = _Fields({k: v[i] for k, v in columns.items() if isinstance(v, (list, tuple)) and len(v) == len(completions)})
            fields.update(prompt=_prompt_text(prompts[i]) if prompts is not None else "", completion=answer)
            texts.append(prompt_template.format_map(fields))
        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(texts)))) as pool:
            return list(pool.map(ask, texts))

    return named(reward, "judge")
