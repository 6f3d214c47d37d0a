"""Precision and recall of each doctor rule over the labelled run histories of tests/_doctor_cases.py.

    python bench/doctor_eval.py            # markdown table (pasted into docs/observability.md)

A rule's firing counts as a true positive when the case's label names that cause, as a false
positive otherwise (also when it is a rival the case tolerates: a rival fits the metrics, but the
label says it is not the cause); a labelled cause the rule missed is a false negative.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from _doctor_cases import all_cases  # noqa: E402

from rlvr.observe.doctor import RULES, Context, diagnose  # noqa: E402


def evaluate(cases) -> tuple[dict, list[tuple[str, set, set]]]:
    """Per rule (tp, fp, fn, tolerated firings), and (case, expected, found) for every case."""
    counts = {r: Counter() for r in RULES}
    verdicts = []
    for c in cases:
        found = {f.rule for f in diagnose(c.history, Context(config=c.config))}
        verdicts.append((c.name, c.expected, found))
        for r in RULES:
            if r in found and r in c.expected:
                counts[r]["tp"] += 1
            elif r in found:
                counts[r]["fp"] += 1
                counts[r]["tolerated"] += r in c.tolerated
            elif r in c.expected:
                counts[r]["fn"] += 1
    return counts, verdicts


def table(counts: dict) -> list[str]:
    def ratio(a, b):
        return f"{a / b:.2f} ({a}/{b})" if b else "-"

    lines = ["| rule | labelled | fired | precision | recall | false positives that were tolerated rivals |", "|---|---|---|---|---|---|"]
    for r, c in counts.items():
        if not (c["tp"] + c["fp"] + c["fn"]):
            continue
        lines.append(
            f"| `{r}` | {c['tp'] + c['fn']} | {c['tp'] + c['fp']} | {ratio(c['tp'], c['tp'] + c['fp'])} | "
            f"{ratio(c['tp'], c['tp'] + c['fn'])} | {c['tolerated']} |"
        )
    return lines


def main() -> None:
    cases = all_cases()
    counts, verdicts = evaluate(cases)
    real = sum(c.real for c in cases)
    print(f"{len(cases)} labelled histories ({len(cases) - real} synthetic, {real} real runs)\n")
    print("\n".join(table(counts)))
    wrong = [(n, e, f) for n, e, f in verdicts if e != f]
    if wrong:
        print("\nCases whose verdict differs from the label:")
        for n, e, f in wrong:
            print(f"- {n}: labelled {sorted(e) or 'healthy'}, doctor named {sorted(f) or 'nothing'}")


if __name__ == "__main__":
    main()
