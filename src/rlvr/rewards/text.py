"""The text of prompts and completions (plain or chat), and the program in a completion.
(Final math answers: rlvr.rewards.math_extract.)

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```")
    'print(1)\\n'
    >>> extract_solution("Sure!\\ndef f(x):\\n    return x\\nThis returns x.", entry_point="f")
    'def f(x):\\n    return x'
"""

from __future__ import annotations

import ast
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
    blocks: list[tuple[str, str]] = []
    k = 0
    while k < len(fences):
        line_end = text.find("\n", fences[k] + 3)
        if line_end < 0:
            break
        header = re.match(r"[ \t]*([\w+-]*)", text[fences[k] + 3 : line_end])
        assert header is not None, "the pattern matches the empty string"
        language = header.group(1)
        k = bisect.bisect_left(fences, line_end + 1)
        if k == len(fences):
            return blocks, text[line_end + 1 :] if not blocks else None
        blocks.append((language, text[line_end + 1 : fences[k]]))
        k += 1
    return blocks, None


# ----------------------------------------------------------------------- solutions

_PYTHON = ("python", "py", "python3", "")
_CODE_START = re.compile(r"(async\s+def|def|class|import|from|@)\b")
_CONTINUES = re.compile(r"(def|class|import|from|@|if|elif|else|for|while|try|except|finally|with|return|async|#|assert)\b")


def extract_solution(text: str, entry_point: str | None = None) -> str:
    """The program a completion offers as its solution (what the `code` graders run).

    - Fenced blocks: the last python (or unlabelled) block that defines `entry_point` (else any function or
      class); a block of only tests (asserts, calls, `def test_*`) is never the solution when another block is.
    - No fence: the code that starts at the first `def`/`class`/`import`/`from`/`@` line and runs until the
      first unindented line that is prose, so sentences before and after the function are dropped.
    - Otherwise the whole text (it may simply be code).
    """
    blocks, unterminated = fenced_blocks(text)
    if unterminated is not None:
        blocks = [*blocks, ("", unterminated)]
    if blocks:
        python = [code for lang, code in blocks if lang.lower() in _PYTHON] or [code for _, code in blocks]
        defining = [code for code in python if entry_point is not None and entry_point in _defined_names(code)]
        defining = defining or [code for code in python if _defined_names(code) - _test_names(code)]
        non_tests = [code for code in python if not _only_tests(code)]
        return (defining or non_tests or python)[-1]
    return _unfenced_code(text)


def _top_level(code: str) -> list[ast.stmt] | None:
    try:
        return ast.parse(code).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _defined_names(code: str) -> set[str]:
    body = _top_level(code)
    if body is None:  # unparseable: read the def lines, so a broken solution is still chosen (and fails)
        return set(re.findall(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", code, re.M))
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _test_names(code: str) -> set[str]:
    return {n for n in _defined_names(code) if n.startswith("test")}


def _only_tests(code: str) -> bool:
    """Asserts, calls, prints, imports and `def test_*` only: what checks a solution rather than being one."""
    body = _top_level(code)
    if not body:
        return False
    for node in body:
        if isinstance(node, (ast.Assert, ast.Import, ast.ImportFrom, ast.Expr)):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            continue
        if isinstance(node, ast.If) and "__main__" in ast.dump(node.test):
            continue
        return False
    return True


def _unfenced_code(text: str) -> str:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    if start is None:
        return text
    end = start + 1
    while end < len(lines):
        line = lines[end]
        if line.strip() and not line[0].isspace() and not _CONTINUES.match(line) and _top_level(line) is None:
            break  # an unindented line that is neither a statement nor code: prose after the function
        end += 1
    return "\n".join(lines[start:end]).rstrip()
