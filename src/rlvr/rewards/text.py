"""The text of prompts and completions (plain or chat), and the program in a completion.
(Final math answers: rlvr.rewards.math_extract.)

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```")
    'print(1)\\n'
"""

from __future__ import annotations

import re


def completion_text(completion) -> str:
    """The text of a completion: plain text, or TRL's chat form [{"role", "content"}, ...]
    (only assistant turns count when roles are given)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)):
        parts = [m for m in completion if isinstance(m, dict)]
        if any("role" in m for m in parts):
            parts = [m for m in parts if m.get("role", "assistant") == "assistant"]
        return "".join(str(m.get("content") or "") for m in parts)
    return "" if completion is None else str(completion)


def prompt_text(prompt) -> str:
    """A prompt as text: chat messages (any role) joined, or the string itself."""
    if isinstance(prompt, (list, tuple)):
        return "\n".join(str(m.get("content") or "") for m in prompt if isinstance(m, dict))
    return "" if prompt is None else str(prompt)


def extract_code(text: str) -> str:
    """The program in a completion: the last ```python (or unlabelled) fenced block; else the
    whole text, which may simply be code."""
    blocks = re.findall(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", text, flags=re.DOTALL)
    if blocks:
        python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3", "")]
        return (python or [code for _, code in blocks])[-1]
    unterminated = re.search(r"```[ \t]*(?:python|py|python3)?[^\n]*\n(.*)$", text, flags=re.DOTALL)
    return unterminated.group(1) if unterminated else text
