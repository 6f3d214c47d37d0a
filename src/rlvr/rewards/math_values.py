"""Reading a final answer as a value, the way people write numbers, and comparing values exactly.

    >>> read_answer("\\u22121,234.5 dollars")   # Unicode minus, thousands separator, a unit
    [Number(value=Fraction(-2469, 2), written=Fraction(-2469, 2), percent=False, text='-1,234.5 dollars')]
    >>> [v.values for v in read_answer("1,5")]  # a list, never the number 15
    [(Fraction(1, 1), Fraction(5, 1))]
    >>> read_answer("42 or 43") is None         # hedging states no answer
    True

Rules (README, "The math grader"): a minus is `-`, U+2212 or a dash before the number; `1,234`
(groups of three) is one number and `1,5`, `1, 2` or `1 2` are lists; `50%` is 1/2 (and 50 when
the question asks for a percentage); `1.5e3` and `1.5 \\times 10^3` are 1500; `\\frac{a}{b}`,
`a/b` and decimals are exact fractions; a trailing unit (`cm`, `\\text{ apples}`, `^\\circ`) and
a currency sign are ignored. An equation states each side that is not a bare name (`x = 5`
states 5; `41 = 42` states 41 and 42, two answers). `or`, `either`, a range (`5 to 7`, `5–7`)
and a negation are hedges. Anything else is an `Expression`, compared symbolically elsewhere.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from fractions import Fraction

MAX_ANSWER_CHARS = 300  # a longer "answer" is not an answer (and is never parsed)
MAX_DIGITS = 200  # longest number literal read exactly
MAX_EXPONENT = 400  # 1e999999 is not computed


@dataclass(frozen=True)
class Number:
    value: Fraction  # what it means: 50% -> 1/2
    written: Fraction  # the digits as written, without the percent sign
    percent: bool
    text: str


@dataclass(frozen=True)
class NumberList:
    values: tuple[Fraction, ...]  # as written, in order
    text: str


@dataclass(frozen=True)
class Expression:
    text: str  # normalised LaTeX, for math-verify
    key: str  # the text without spacing or markup, for exact comparison


Value = Number | NumberList | Expression

# ------------------------------------------------------------------ normalising

_DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\ufe58\ufe63\uff0d"
_SYMBOLS = {
    "\u2212": "-",
    "\u00d7": "\\times ",
    "\u22c5": "\\cdot ",
    "\u00b7": "\\cdot ",
    "\u00f7": "\\div ",
    "\u221a": "\\sqrt",
    "\u03c0": "\\pi ",
    "\u00b0": "^\\circ",
    "\u2264": "\\le ",
    "\u2265": "\\ge ",
    "\u2260": "\\ne ",
    "\u221e": "\\infty ",
}
_UNWRAP = re.compile(r"\\(?:boxed|fbox|textbf|mathbf|displaystyle\s*)\{((?:[^{}]|\{[^{}]*\})*)\}")
_TEXT = re.compile(r"\\(?:text|textrm|mathrm|mbox|textit|mathit|operatorname)\s*\{([^{}]*)\}")


def normalize(text: str) -> str:
    """Unicode and LaTeX spelling reduced to one form (the value is unchanged)."""
    s = unicodedata.normalize("NFKC", text)
    for k, v in _SYMBOLS.items():
        s = s.replace(k, v)
    s = re.sub(rf"(?<=\d)\s*[{_DASHES}]\s*(?=\d)", " to ", s)  # 5–7 is a range
    s = re.sub(rf"[{_DASHES}]", "-", s)
    s = re.sub(r"(?<=\d)\{,\}(?=\d{3})", ",", s)  # 1{,}000
    s = re.sub(r"(?<=\d)\\[,;:! ](?=\d{3}\b)", "", s)  # 1\,000
    s = re.sub(r"\\(?:left|right|displaystyle|!)|\\[,;: ]|~", " ", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\$", "$").replace("\\%", "%")
    for _ in range(3):  # nested wrappers
        s = _UNWRAP.sub(r"\1", s)
    s = s.replace("**", "").replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "")
    s = re.sub(r"\s+", " ", s).strip()
    return s.strip("$").strip().rstrip(".").strip()


# ------------------------------------------------------------------ numbers

_BODY = (
    r"(?:\\frac\{(?P<fn>[+-]?\d+(?:\.\d+)?)\}\{(?P<fd>[+-]?\d+(?:\.\d+)?)\}|\\frac(?P<fn1>\d)(?P<fd1>\d)"
    r"|(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?|\.\d+)(?:/(?P<den>\d+))?)"
    r"(?:[eE](?P<e>[+-]?\d+)|\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{?(?P<p>[+-]?\d+)\}?)?"
)
_UNITS = "cm|mm|km|kg|mg|ml|lbs?|oz|ft|mph|kph|hrs?|mins?|sec|yds?|mi"
_UNIT = (
    r"(?:\s*(?:\^\s*\{?\\circ\}?|\\text\{[^{}]*\}|\\mathrm\{[^{}]*\}|\\mbox\{[^{}]*\})"  # marked-up units
    rf"|(?:{_UNITS})(?:\^?[23])?\b|\s+[A-Za-z][A-Za-z./']*(?:\^?[23])?)*"
)  # cm, or words after a space
_NUMBER = re.compile(rf"(?P<sign>[+-])?\s*(?:\$|USD|€|£)?\s*(?P<sign2>[+-])?\s*{_BODY}\s*(?P<pct>%|percent\b)?(?P<unit>{_UNIT})\s*")
_NEGATION = re.compile(r"\b(?:not|no|never|neither|nor|except|isn't|cannot|can't)\b|n't\b", re.IGNORECASE)
_HEDGE = re.compile(r"\b(?:or|either)\b|\\lor\b|\\vee\b|\d\s*to\s*[-+$]?\d|\bbetween\b", re.IGNORECASE)
_MATH_WORDS = {"sin", "cos", "tan", "cot", "sec", "csc", "log", "exp", "sqrt", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "frac"}


def read_number(s: str) -> Number | None:
    """A single number, with an optional sign, currency sign, percent sign and unit, else None."""
    if len(s) > MAX_DIGITS:
        return None
    m = _NUMBER.fullmatch(s)
    if m is None or (m.group("sign") and m.group("sign2")):
        return None
    g = m.groupdict()
    try:
        if g["fn"] is not None or g["fn1"] is not None:
            written = Fraction(g["fn"] or g["fn1"]) / Fraction(g["fd"] or g["fd1"])
        else:
            written = Fraction(g["num"].replace(",", ""))
            if g["den"] is not None:
                written /= int(g["den"])
        exponent = int(g["e"] or g["p"] or 0)
    except (ValueError, ZeroDivisionError):
        return None
    if abs(exponent) > MAX_EXPONENT:
        return None
    written *= Fraction(10) ** exponent
    if "-" in (g["sign"] or "") + (g["sign2"] or ""):
        written = -written
    percent = g["pct"] is not None
    return Number(written / 100 if percent else written, written, percent, s)


_PROSE_NUMBER = re.compile(r"(?<![\w.,/])[+-]?\$?(?:\d{1,3}(?:,\d{3})+(?![\d,])|\d+)(?:\.\d+)?(?:/\d+)?%?(?![\w/])")


def numbers_in_prose(s: str) -> list[Number]:
    """The numbers written in running text ("Tom has 42 apples"), in order."""
    found = [read_number(m.group()) for m in _PROSE_NUMBER.finditer(s)]
    return [n for n in found if n is not None]


def _is_prose(s: str) -> bool:
    """Words around the number ("Tom has 42 apples"), not a formula."""
    words = [w for w in re.findall(r"[A-Za-z]{3,}", s) if w.lower() not in _MATH_WORDS]
    return bool(words) and " " in s and not re.search(r"[\\^_{}=]", s)


# ------------------------------------------------------------------ answers


def _split_top_level(s: str, seps: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch in seps and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    return [p.strip() for p in parts + [s[start:]]]


def _strip_parens(s: str) -> str:
    """((5)) -> 5; a tuple (1, 2) and an interval keep theirs."""
    while s.startswith("(") and s.endswith(")") and "," not in s and _closes_at(s) == len(s) - 1:
        s = s[1:-1].strip()
    return s


def _closes_at(s: str) -> int:
    """Index of the bracket closing s[0]."""
    depth = 0
    for i, ch in enumerate(s):
        depth += (ch in "([{") - (ch in ")]}")
        if depth == 0:
            return i
    return -1


def read_value(s: str) -> Value | None:
    """One side of an answer: a number, a list of numbers, or an expression; None: unreadable prose."""
    s = _strip_parens(_TEXT.sub(lambda m: f"\\text{{{m.group(1)}}}", s).strip())
    if (number := read_number(s)) is not None:
        return number
    items = _split_top_level(s, ",;") if re.search(r"[,;]", s) else re.split(r"\s+(?:and\s+)?|\s*\\text\{\s*and\s*\}\s*", s)
    if len(items) > 1 and all(items):
        numbers = [n for x in items if (n := read_number(x)) is not None]
        if len(numbers) == len(items):
            return NumberList(tuple(n.written for n in numbers), s)
    plain = _TEXT.sub(r"\1", s)
    if _is_prose(plain):
        numbers = numbers_in_prose(plain)
        if len({n.value for n in numbers}) == 1:
            return numbers[-1]
        return NumberList(tuple(n.written for n in numbers), s) if numbers else None
    key = re.sub(r"\s+|\\text\{|\\mathrm\{|[{}]", "", s)
    key = re.sub(r"^\(([A-Za-z])\)$", r"\1", key)  # (B) is the choice B
    return Expression(s, key)


def read_answer(text: str) -> list[Value] | None:
    """The values a final answer states: usually one; one per side of an equation whose sides are
    not bare names. None when it hedges, negates, is empty, too long, or says nothing readable."""
    if len(text) > MAX_ANSWER_CHARS:
        return None
    s = normalize(text)
    plain = _TEXT.sub(r" \1 ", s)
    if not s or _HEDGE.search(plain) or (_NEGATION.search(plain) and re.search(r"\d", plain)):
        return None
    sides = [x.strip() for x in re.split(r"(?<![<>!:\\])=+|\\approx", s)]
    if len(sides) > 1:
        named = [x for x in sides if not re.search(r"\d", x)]
        sides = [x for x in sides if x not in named] or sides[-1:]
    values = [v for x in sides if (v := read_value(x)) is not None]
    return values if len(values) == len(sides) else None


_PERCENT_QUESTION = re.compile(
    r"\bwhat percent|\bpercentage\b|\bhow many percent|\bas a percent|\bin percent|\bpercent (?:of|did|does|is|was)\b", re.IGNORECASE
)


def asks_for_percent(prompt_text: str) -> bool:
    return bool(_PERCENT_QUESTION.search(prompt_text or ""))


def same_exactly(gold: Value, answer: Value, percent_question: bool = False) -> bool | None:
    """True/False when the two values compare without symbolic algebra; None when they need it."""
    if isinstance(gold, Number) and isinstance(answer, Number):
        if gold.value == answer.value:
            return True
        # 50% for a gold "50" when the question asks for a percentage; "50" for a gold "50%"
        return gold.written == answer.written and (gold.percent or (answer.percent and percent_question))
    if isinstance(gold, NumberList) and isinstance(answer, NumberList):
        return sorted(gold.values) == sorted(answer.values)
    if isinstance(gold, Expression) and isinstance(answer, Expression) and gold.key == answer.key:
        return True
    if isinstance(gold, (Number, NumberList)) and isinstance(answer, (Number, NumberList)):
        return False
    return None
