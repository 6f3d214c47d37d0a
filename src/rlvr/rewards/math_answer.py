"""Math answer correctness: the final answer against the ground-truth column, 0 or 1.

    >>> math_correct(None, ["... so x = \\\\boxed{\\\\frac{1}{2}}", "#### 3", "x is 0.5"], answer=["0.5", "4", "1/2"])
    [1.0, 0.0, 1.0]

The answer is taken from `\\boxed{}`, then `<answer>...</answer>`, then `#### x`, then the
last number (see `rlvr.rewards.text`). It is compared numerically (integers, decimals,
fractions, `\\frac`, exactly, with Fraction arithmetic) and, when `math-verify` is installed
(`pip install rlvr[math]`), symbolically too (`(x+1)^2` equals `x^2+2x+1`). math-verify's
own timeouts rely on signal.alarm, which fails off the main thread, so they are disabled
here and the reward runner's timeout bounds a slow comparison instead.

Known hacks it guards against: listing several candidates (`\\boxed{3, 4, 5}` is not 4), and
hedging over several boxes/tags (only the last one counts). Config: `fn: math`, or
`fn: "math(column='solution')"` to read another dataset column.
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction

from rlvr.rewards.factory import named, reward_factory
from rlvr.rewards.text import completion_text, extract_final_answer

log = logging.getLogger("rlvr.rewards")
MAX_ANSWER_CHARS = 300  # longer "answers" are not parsed symbolically (sympy can take forever)

try:
    import math_verify

    # It warns on every call that its timeouts are off; we disable them on purpose (see above).
    logging.getLogger("math_verify").setLevel(logging.ERROR)
except ImportError:  # optional extra
    math_verify = None


def _strip_latex(s: str) -> str:
    s = s.strip().strip("$").strip()
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:left|right|!|,|;|:|displaystyle)", "", s)
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "").replace("dfrac", "frac").replace("tfrac", "frac")
    return s.strip().rstrip(".").strip()


def as_number(s: str) -> Fraction | None:
    """Exact value of an integer / decimal / fraction / \\frac{a}{b} / scientific literal."""
    s = _strip_latex(s).replace(",", "").replace(" ", "")
    m = re.fullmatch(r"(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", s)
    try:
        if m:
            value = Fraction(m.group(2)) / Fraction(m.group(3))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)(e-?\d{1,3})?|-?\d+/\d+", s, flags=re.IGNORECASE):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _same_symbolically(gold: str, answer: str) -> bool:
    if math_verify is None or len(answer) > MAX_ANSWER_CHARS:
        return False
    try:
        g = math_verify.parse(f"${gold}$", parsing_timeout=None)
        a = math_verify.parse(f"${answer}$", parsing_timeout=None)
        return bool(g and a and math_verify.verify(g, a, timeout_seconds=None))
    except Exception:  # a malformed expression is simply not equal
        return False


def answers_match(gold: str, answer: str | None) -> bool:
    if answer is None:
        return False
    gold = extract_final_answer(gold) if re.search(r"####|\\boxed|<answer>", gold) else gold
    g, a = as_number(gold), as_number(answer)
    if g is not None and a is not None:
        return g == a
    if g is None and a is None and _strip_latex(gold).replace(" ", "") == _strip_latex(answer).replace(" ", ""):
        return True
    return _same_symbolically(_strip_latex(gold), _strip_latex(answer))


def math_correct(prompts, completions, answer, **kwargs) -> list[float | None]:
    """1.0 when the completion's final answer equals the `answer` column, else 0.0; None where
    the row has no ground truth."""
    out = []
    for c, gold in zip(completions, answer):
        if gold is None:
            out.append(None)
            continue
        out.append(float(answers_match(str(gold), extract_final_answer(completion_text(c)))))
    return out


@reward_factory
def math(column: str = "answer", require_math_verify: bool = False):
    """Build a math grader reading the ground truth from `column`."""
    if require_math_verify and math_verify is None:
        raise ImportError("math(require_math_verify=True) needs math-verify: pip install 'rlvr[math]'")
    if math_verify is None:
        log.info("math grader: math-verify not installed, comparing numbers and exact strings only")

    def reward(prompts, completions, **columns):
        if column not in columns:
            raise KeyError(f"math grader: the dataset has no {column!r} column (have: {sorted(columns)})")
        return math_correct(prompts, completions, columns[column])

    return named(reward, "math")
