"""The text of prompts and completions (plain or chat), and the program in a completion.
(Final math answers: rlvr.rewards.math_extract.)

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```")
    'print(1)\\n'
"""

from __future__ import annotations

import bisect
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
    whole text, which may simply be code. One linear pass over the fences (no regex backtracking
    on 50 KB of backticks)."""
    blocks, unterminated = fenced_blocks(text)
    if blocks:
        python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3", "")]
        return (python or [code for _, code in blocks])[-1]
    return unterminated if unterminated is not None else text


def fenced_blocks(text: str) -> tuple[list[tuple[str, str]], str | None]:
    """([(language, code)] of the complete ``` blocks, in order; the code after an opening fence
    that is never closed, or None)."""
    fences = [m.start() for m in re.finditer("```", text)]
    blocks, k = [], 0
    while k < len(fences):
        line_end = text.find("\n", fences[k] + 3)
        if line_end < 0:
            break
        language = re.match(r"[ \t]*([\w+-]*)", text[fences[k] + 3: line_end]).group(1)
        k = bisect.bisect_left(fences, line_end + 1)
        if k == len(fences):
            return blocks, text[line_end + 1:] if not blocks else None
        blocks.append((language, text[line_end + 1: fences[k]]))
        k += 1
    return blocks, None
