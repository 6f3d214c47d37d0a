"""The code task's function families: what each function does up to its parameters, its parameter space,
a reference solution, random inputs and fixed edge inputs (`Family`), grouped in four categories."""

from __future__ import annotations

import itertools
import random
import string
from dataclasses import dataclass
from typing import Any, Callable

_LETTERS = string.ascii_lowercase
_WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "house", "green", "quick", "sun", "map", "dog", "blue"]
_SUFFIXES = ["ing", "ed", "ly", "!", "?", "_x", "123", "ness"]
_SEPARATORS = [",", ";", "|", " ", "-", ":", "/"]


def _word(rng: random.Random) -> str:
    return rng.choice(_WORDS)


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_LETTERS[:8] + "xyz ") for _ in range(rng.randint(0, 10))).strip()


def _ints(rng: random.Random, lo: int = -9, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(0, 7))]


def _joined(rng: random.Random, sep: str) -> str:
    return sep.join(str(rng.randint(0, 99)) for _ in range(rng.randint(1, 6)))


def _words_joined(rng: random.Random, sep: str) -> str:
    return sep.join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6)))


@dataclass(frozen=True)
class Family:
    """A kind of function. `space` lists every parameter choice; `spec` and `solve` read them."""

    name: str  # also the function's name
    category: str  # strings, lists, arithmetic, parsing
    args: str  # the signature's arguments, e.g. "xs"
    spec: str  # what it returns, a format string over the parameters
    space: tuple[dict, ...]
    solve: Callable[..., Any]  # (params, *args) -> the right answer (our own trusted reference)
    inputs: Callable[[random.Random, dict], tuple]  # one test's arguments
    edges: Callable[[dict], tuple] = lambda p: ()  # arguments always tested too: the branches a wrong solution skips


def _space(**choices) -> tuple[dict, ...]:
    keys = list(choices)
    return tuple(dict(zip(keys, values)) for values in itertools.product(*(choices[k] for k in keys)))


FAMILIES: tuple[Family, ...] = (
    # ---- strings
    Family(
        "repeat_string",
        "strings",
        "s",
        "returns the string `s` repeated {n} times",
        _space(n=range(2, 8)),
        lambda p, s: s * p["n"],
        lambda r, p: (_word(r),),
    ),
    Family(
        "remove_char",
        "strings",
        "s",
        "returns `s` with every '{c}' removed",
        _space(c=_LETTERS),
        lambda p, s: s.replace(p["c"], ""),
        lambda r, p: (_text(r) + r.choice(["", p["c"]]),),
    ),
    Family(
        "count_char",
        "strings",
        "s",
        "returns how many times the character '{c}' occurs in `s`",
        _space(c=_LETTERS),
        lambda p, s: s.count(p["c"]),
        lambda r, p: (_text(r) + p["c"] * r.randint(0, 2),),
        lambda p: ((next(w for w in _WORDS if p["c"] not in w),),),
    ),
    Family(
        "add_suffix",
        "strings",
        "s",
        "returns `s` followed by '{suffix}'",
        _space(suffix=_SUFFIXES),
        lambda p, s: s + p["suffix"],
        lambda r, p: (_word(r),),
    ),
    Family(
        "first_chars",
        "strings",
        "s",
        "returns the first {n} characters of `s` (all of `s` if it is shorter)",
        _space(n=range(1, 7)),
        lambda p, s: s[: p["n"]],
        lambda r, p: (_word(r)[: r.randint(0, 6)],),
    ),
    # ---- lists
    Family(
        "scale_list",
        "lists",
        "xs",
        "returns a new list with every element of the list `xs` multiplied by {k}",
        _space(k=range(2, 11)),
        lambda p, xs: [x * p["k"] for x in xs],
        lambda r, p: (_ints(r),),
    ),
    Family(
        "keep_greater",
        "lists",
        "xs",
        "returns the elements of the list `xs` that are greater than {t}, in order",
        _space(t=range(-3, 11)),
        lambda p, xs: [x for x in xs if x > p["t"]],
        lambda r, p: (_ints(r),),
        lambda p: (([p["t"] - 1, p["t"], p["t"] + 1],),),
    ),
    Family(
        "count_equal",
        "lists",
        "xs",
        "returns how many elements of the list `xs` are equal to {v}",
        _space(v=range(0, 10)),
        lambda p, xs: xs.count(p["v"]),
        lambda r, p: (_ints(r, 0, 9) + [p["v"]] * r.randint(0, 2),),
    ),
    Family(
        "sum_multiples",
        "lists",
        "xs",
        "returns the sum of the elements of the list `xs` that are divisible by {k}",
        _space(k=range(2, 8)),
        lambda p, xs: sum(x for x in xs if x % p["k"] == 0),
        lambda r, p: (_ints(r),),
        lambda p: (([p["k"], -p["k"], p["k"] + 1, 2 * p["k"]],),),
    ),
    Family(
        "last_items",
        "lists",
        "xs",
        "returns the last {n} elements of the list `xs` (all of them if it is shorter)",
        _space(n=range(1, 6)),
        lambda p, xs: xs[-p["n"] :],
        lambda r, p: (_ints(r),),
        lambda p: (([],), (list(range(p["n"] + 2)),)),
    ),
    # ---- arithmetic
    Family(
        "linear",
        "arithmetic",
        "x",
        "returns {a} * x + {b} for the integer `x`",
        _space(a=range(2, 6), b=range(-5, 6)),
        lambda p, x: p["a"] * x + p["b"],
        lambda r, p: (r.randint(-50, 50),),
    ),
    Family(
        "is_multiple",
        "arithmetic",
        "n",
        "returns True if the integer `n` is divisible by {k}, else False",
        _space(k=range(2, 13)),
        lambda p, n: n % p["k"] == 0,
        lambda r, p: (r.randint(0, 12) * r.choice([1, p["k"]]),),
        lambda p: ((3 * p["k"],), (3 * p["k"] + 1,)),
    ),
    Family(
        "clamp",
        "arithmetic",
        "x",
        "returns `x` limited to the range {lo} to {hi}: {lo} if `x` is smaller, {hi} if it is larger, else `x`",
        _space(lo=range(-5, 1), hi=range(5, 11)),
        lambda p, x: min(max(x, p["lo"]), p["hi"]),
        lambda r, p: (r.randint(-15, 20),),
        lambda p: ((p["lo"] - 3,), (p["hi"] + 4,), (p["lo"] + 1,)),
    ),
    Family(
        "power",
        "arithmetic",
        "x",
        "returns the integer `x` raised to the power {e}",
        _space(e=range(2, 6)),
        lambda p, x: x ** p["e"],
        lambda r, p: (r.randint(-6, 9),),
    ),
    Family(
        "digit_sum_plus",
        "arithmetic",
        "n",
        "returns the sum of the decimal digits of the non-negative integer `n`, plus {k}",
        _space(k=range(0, 10)),
        lambda p, n: sum(map(int, str(n))) + p["k"],
        lambda r, p: (r.randint(0, 99999),),
    ),
    # ---- parsing
    Family(
        "sum_numbers",
        "parsing",
        "s",
        "takes a string `s` of integers separated by '{sep}' and returns their sum",
        _space(sep=_SEPARATORS),
        lambda p, s: sum(int(t) for t in s.split(p["sep"])),
        lambda r, p: (_joined(r, p["sep"]),),
    ),
    Family(
        "count_words",
        "parsing",
        "s",
        "takes a string `s` of words separated by '{sep}' and returns how many words it holds",
        _space(sep=_SEPARATORS),
        lambda p, s: len(s.split(p["sep"])),
        lambda r, p: (_words_joined(r, p["sep"]),),
    ),
    Family(
        "nth_word",
        "parsing",
        "s",
        "takes a string `s` of words separated by '{sep}' and returns word number {n} (counting from 1), or '' if there are fewer words",
        _space(sep=_SEPARATORS, n=range(1, 4)),
        lambda p, s: (s.split(p["sep"]) + [""] * p["n"])[p["n"] - 1],
        lambda r, p: (_words_joined(r, p["sep"]),),
        lambda p: ((p["sep"].join(_WORDS[: p["n"] + 2]),), *(((p["sep"].join(_WORDS[: p["n"] - 1]),),) if p["n"] > 1 else ())),
    ),
    Family(
        "value_of",
        "parsing",
        "s",
        "takes a string `s` like 'key{sep}12' and returns the number after '{sep}' as an int",
        _space(sep=["=", ":", "->", " is "]),
        lambda p, s: int(s.split(p["sep"])[1]),
        lambda r, p: (f"{_word(r)}{p['sep']}{r.randint(0, 999)}",),
    ),
    # ---- held out as whole families (one per category)
    Family(
        "replace_char",
        "strings",
        "s",
        "returns `s` with every '{a}' replaced by '{b}'",
        tuple(p for p in _space(a=_LETTERS[:8], b="xyz") if p["a"] != p["b"]),
        lambda p, s: s.replace(p["a"], p["b"]),
        lambda r, p: (_text(r) + p["a"],),
    ),
    Family(
        "max_minus",
        "lists",
        "xs",
        "returns the largest element of the non-empty list `xs` minus {k}",
        _space(k=range(1, 10)),
        lambda p, xs: max(xs) - p["k"],
        lambda r, p: (_ints(r) + [r.randint(-9, 20)],),
        lambda p: (([-5, -2, -9],),),
    ),
    Family(
        "distance_to",
        "arithmetic",
        "x",
        "returns the absolute difference between the integer `x` and {k}",
        _space(k=range(-10, 11)),
        lambda p, x: abs(x - p["k"]),
        lambda r, p: (r.randint(-30, 30),),
        lambda p: ((p["k"] - 7,), (p["k"] + 3,)),
    ),
    Family(
        "largest_number",
        "parsing",
        "s",
        "takes a string `s` of integers separated by '{sep}' and returns the largest",
        _space(sep=_SEPARATORS),
        lambda p, s: max(int(t) for t in s.split(p["sep"])),
        lambda r, p: (_joined(r, p["sep"]),),
    ),
)
FAMILY = {f.name: f for f in FAMILIES}
HELD_OUT_FAMILIES = frozenset({"replace_char", "max_minus", "distance_to", "largest_number"})
CATEGORIES = ("strings", "lists", "arithmetic", "parsing")
