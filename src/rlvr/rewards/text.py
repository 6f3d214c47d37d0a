"""Getting the answer out of a completion: text of chat/plain completions, final answers, code.

    >>> extract_final_answer("so the total is \\\\boxed{\\\\frac{1}{2}}")
    '\\\\frac{1}{2}'
    >>> extract_final_answer("<think>2+2</think><answer> 4 </answer>")
    '4'
    >>> extract_final_answer("She pays 3 + 4 = 7 dollars.\\n#### 7")
    '7'
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


def extract_boxed(text: str) -> str | None:
    """Contents of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip()
    return None


def extract_answer_tag(text: str) -> str | None:
    found = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None


_NUMBER = r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+"


def extract_gsm8k(text: str) -> str | None:
    m = re.search(r"####\s*(" + _NUMBER + r")", text)
    return m.group(1).replace(",", "") if m else None


def extract_last_number(text: str) -> str | None:
    found = re.findall(_NUMBER, text)
    return found[-1].replace(",", "") if found else None


def extract_final_answer(text: str) -> str | None:
    """The final answer, by precedence: \\boxed{}, <answer>, `#### x`, then the last number."""
    for extract in (extract_boxed, extract_answer_tag, extract_gsm8k, extract_last_number):
        found = extract(text)
        if found:
            return found
    return None


def extract_code(text: str) -> str:
    """The program in a completion: the last ```python (or unlabelled) fenced block; else the
    whole text, which may simply be code."""
    blocks = re.findall(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", text, flags=re.DOTALL)
    if blocks:
        python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3", "")]
        return (python or [code for _, code in blocks])[-1]
    unterminated = re.search(r"```[ \t]*(?:python|py|python3)?[^\n]*\n(.*)$", text, flags=re.DOTALL)
    return unterminated.group(1) if unterminated else text
