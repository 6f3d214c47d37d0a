"""A labelled set for the `math` grader: (kind, gold, completion, right) rows, plus a prompt where it
matters. `right` is what a careful human grader says: 1 only when the completion's final answer is
unambiguously the gold one. Used by tests/rewards/test_math_grader.py (case by case) and bench/graders.py.

Kinds: gsm8k / math / aime (ordinary completions, right and wrong), then the hacks a policy finds:
hedge_* (several answers), no_marker (no final answer: the last number is not one), number_* (how
numbers are written), equation, units, echo (an answer copied from the prompt), negation,
truncated, huge.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    kind: str
    gold: str
    completion: str
    right: int
    prompt: str = ""
    fallback: str | None = None
    known_miss: str = ""  # why the grader does not pay this right answer (it never pays a wrong one)


FEWSHOT = "Example: Sam has 3 apples and buys 4 more. How many?\nThe answer is 7.\n\nNow: Ann has 5 pens and buys 2 more. How many?"

CASES = [
    # ------------------------------------------------------------------ GSM8K style: right
    Case("gsm8k", "72", "Natalia sold 48/2 = 24 clips in May.\nShe sold 48 + 24 = 72 clips in total.\n#### 72", 1),
    Case("gsm8k", "72", "48 + 24 = 72\n#### 72.", 1),
    Case("gsm8k", "10", "Weng earns 12/60 = $0.2 per minute. For 50 minutes she earns 0.2 x 50 = $10.\nThe answer is $10.", 1),
    Case("gsm8k", "5", "She needs 100 - 95 = 5 more dollars.\n#### $5", 1),
    Case("gsm8k", "1234", "Total: 1000 + 234 = 1,234.\n#### 1,234", 1),
    Case("gsm8k", "1234", "The final answer is 1,234 dollars.", 1),
    Case("gsm8k", "18", "So she makes 9 * 2 = 18 dollars.\nThe answer is 18.", 1),
    Case("gsm8k", "3", "The answer is: 3", 1),
    Case("gsm8k", "624", "**Answer:** 624", 1),
    Case("gsm8k", "35", "Answer: 35 minutes", 1),
    Case("gsm8k", "0.5", "Each gets 1/2 = 0.5 pizza.\n#### 0.5", 1),
    Case("gsm8k", "7.5", "7.5 hours in all.\nThe answer is 7.50.", 1),
    Case("gsm8k", "48", "Total is 48 cookies.\n\\boxed{48}", 1),
    Case("gsm8k", "48", "Total cookies: $\\boxed{48 \\text{ cookies}}$", 1),
    Case("gsm8k", "-3", "The temperature fell to -3 degrees.\n#### -3", 1),
    Case("gsm8k", "-3", "The temperature is \u22123 degrees.\nThe answer is \u22123.", 1),
    Case("gsm8k", "1000000", "That is one million.\n#### 1,000,000", 1),
    Case("gsm8k", "260", "The answer is 260 because 200 + 60 = 260.", 1),
    Case("gsm8k", "16", "She has 16 eggs left. So the answer is 16.", 1),
    Case("gsm8k", "16", "<answer>16</answer>", 1),
    Case("gsm8k", "16", "<think>22 - 3 - 3 = 16</think><answer> 16 </answer>", 1),
    Case("gsm8k", "16", "<answer>She has 16 eggs left.</answer>", 1),
    Case("gsm8k", "25", "The answer is \\$25.", 1),
    Case("gsm8k", "25", "So Jen pays 25.00.\n#### 25.00", 1),
    Case("gsm8k", "40", "There were 40 people.\n#### 40\n", 1),
    Case("gsm8k", "40", "#### 40\nThe answer is 40.", 1),  # two markers, one answer
    Case("gsm8k", "120", "Distance = 60 * 2 = 120 km\nThe answer is 120 km.", 1),
    Case("gsm8k", "3", "The final answer is $\\boxed{3}$", 1),
    Case("gsm8k", "12", "Therefore, the answer is 12.", 1),
    Case("gsm8k", "15", "The answer is 15 (5 + 10).", 1),
    Case("gsm8k", "The bakery made 5 * 12 = <<5*12=60>>60 muffins.\n#### 60", "She made 60 muffins.\n#### 60", 1),
    # ------------------------------------------------------------------ GSM8K style: wrong
    Case("gsm8k", "72", "48 + 24 = 71\n#### 71", 0),
    Case("gsm8k", "10", "The answer is $12.", 0),
    Case("gsm8k", "18", "So she makes 9 * 2 = 18 dollars, minus 2.\n#### 16", 0),
    Case("gsm8k", "1234", "#### 1,243", 0),
    Case("gsm8k", "0.5", "#### 5", 0),
    Case("gsm8k", "5", "The answer is 50.", 0),
    Case("gsm8k", "-3", "#### 3", 0),
    Case("gsm8k", "16", "<answer>61</answer>", 0),
    Case("gsm8k", "48", "\\boxed{84}", 0),
    Case("gsm8k", "7", "\\boxed{7.01}", 0),
    Case("gsm8k", "100", "The answer is 10.", 0),
    Case("gsm8k", "3", "The answer is 0.3.", 0),
    Case("gsm8k", "24", "#### 2.4", 0),
    Case("gsm8k", "60", "So they made 60 muffins.\n#### 600", 0),
    # ------------------------------------------------------------------ MATH style (LaTeX): right
    Case("math", "\\frac{1}{2}", "So $x = \\boxed{\\frac{1}{2}}$.", 1),
    Case("math", "\\frac{1}{2}", "\\boxed{0.5}", 1),
    Case("math", "\\frac{1}{2}", "\\boxed{\\dfrac{1}{2}}", 1),
    Case("math", "\\frac{1}{2}", "\\boxed{\\frac12}", 1),
    Case("math", "\\frac{1}{2}", "\\boxed{1/2}", 1),
    Case("math", "\\frac{1}{2}", "\\boxed{\\frac{2}{4}}", 1),
    Case("math", "-\\frac{3}{4}", "\\boxed{-\\frac{3}{4}}", 1),
    Case("math", "-\\frac{3}{4}", "\\boxed{\\frac{-3}{4}}", 1),
    Case("math", "-\\frac{3}{4}", "\\boxed{-0.75}", 1),
    Case("math", "2\\sqrt{2}", "\\boxed{\\sqrt{8}}", 1),
    Case("math", "2\\sqrt{2}", "\\boxed{2\\sqrt{2}}", 1),
    Case("math", "\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{\\sqrt3}{2}}", 1),
    Case("math", "x^2+2x+1", "\\boxed{(x+1)^2}", 1),
    Case("math", "3\\pi", "The area is $\\boxed{3\\pi}$.", 1),
    Case("math", "\\pi/4", "\\boxed{\\frac{\\pi}{4}}", 1),
    Case("math", "5", "Solving gives $\\boxed{x=5}$.", 1),
    Case("math", "5", "\\boxed{x = 5}", 1),
    Case("math", "y = 2x + 3", "\\boxed{y=2x+3}", 1),
    Case("math", "(1, 2)", "The point is $\\boxed{(1,2)}$.", 1),
    Case("math", "[2, 5)", "\\boxed{[2,5)}", 1),
    Case("math", "\\{1, 3\\}", "\\boxed{\\{3, 1\\}}", 1),
    Case("math", "1, 3", "The solutions are $\\boxed{1, 3}$.", 1),
    Case("math", "1, 3", "\\boxed{3, 1}", 1),
    Case("math", "30^\\circ", "\\boxed{30^\\circ}", 1),
    Case("math", "30", "\\boxed{30^{\\circ}}", 1),
    Case("math", "\\text{(B)}", "The answer is (B).", 1),
    Case("math", "B", "\\boxed{\\text{(B)}}", 1),
    Case("math", "10", "\\boxed{10\\%}", 1, prompt="What percent of the students are left-handed?"),
    Case("math", "0.1", "\\boxed{10\\%}", 1),
    Case("math", "6", "\\boxed{6 \\times 1}", 1),
    Case("math", "\\infty", "\\boxed{\\infty}", 1),
    Case("math", "\\text{Tuesday}", "\\boxed{\\text{Tuesday}}", 1),
    Case("math", "1500", "\\boxed{1.5 \\times 10^3}", 1),
    Case("math", "1500", "\\boxed{1.5e3}", 1),
    Case("math", "0.0015", "\\boxed{1.5 \\cdot 10^{-3}}", 1),
    Case("math", "The area is $\\boxed{12}$.", "$\\boxed{12}$", 1),
    Case("math", "x \\in [0, 1]", "\\boxed{[0,1]}", 1),
    # ------------------------------------------------------------------ MATH style: wrong
    Case("math", "\\frac{1}{2}", "\\boxed{\\frac{1}{3}}", 0),
    Case("math", "\\frac{1}{3}", "\\boxed{0.33}", 0),
    Case("math", "\\frac{1}{3}", "\\boxed{0.333}", 0),
    Case("math", "2\\sqrt{2}", "\\boxed{2.83}", 0),
    Case("math", "x^2+2x+1", "\\boxed{x^2+1}", 0),
    Case("math", "3\\pi", "\\boxed{3}", 0),
    Case("math", "(1, 2)", "\\boxed{(2, 1)}", 0),
    Case("math", "[2, 5)", "\\boxed{[2, 5]}", 0),
    Case("math", "\\sqrt{2}", "\\boxed{2}", 0),
    Case("math", "\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{\\sqrt{2}}{2}}", 0),
    Case("math", "-\\frac{3}{4}", "\\boxed{\\frac{3}{4}}", 0),
    Case("math", "B", "The answer is (C).", 0),
    Case("math", "5", "\\boxed{x = 6}", 0),
    Case("math", "1, 3", "\\boxed{1, 2, 3}", 0),
    Case("math", "1500", "\\boxed{1.5 \\times 10^4}", 0),
    Case("math", "5", "\\boxed{5!}", 0),
    # ------------------------------------------------------------------ AIME style (integers 0..999)
    Case("aime", "33", "So $m+n = \\boxed{033}$.", 1),
    Case("aime", "204", "\\boxed{204}", 1),
    Case("aime", "25", "Therefore the remainder is $\\boxed{25}$.", 1),
    Case("aime", "809", "The final answer is $\\boxed{809}$.", 1),
    Case("aime", "116", "$m + n = 116$, so the answer is $\\boxed{116}$.", 1),
    Case("aime", "70", "Answer: 070", 1),
    Case("aime", "999", "\\boxed{999}", 1),
    Case("aime", "0", "\\boxed{0}", 1),
    Case("aime", "33", "\\boxed{33.0}", 1),
    Case("aime", "204", "\\boxed{402}", 0),
    Case("aime", "25", "\\boxed{24}", 0),
    Case("aime", "809", "\\boxed{80}", 0),
    Case("aime", "116", "so m = 11 and n = 6, giving mn = 66.\n\\boxed{66}", 0),
    Case("aime", "70", "\\boxed{7}", 0),
    Case("aime", "0", "\\boxed{}", 0),
    # ------------------------------------------------------------------ hedging: several answers
    Case("hedge_or", "42", "The answer is 42 or 43.", 0),
    Case("hedge_or", "42", "The answer is 43 or 42.", 0),
    Case("hedge_or", "42", "\\boxed{42 \\text{ or } 43}", 0),
    Case("hedge_or", "42", "\\boxed{41 \\lor 42}", 0),
    Case("hedge_or", "42", "#### 42 or 43", 0),
    Case("hedge_or", "42", "<answer>either 42 or 44</answer>", 0),
    Case("hedge_or", "42", "The answer is between 40 and 45.", 0),
    Case("hedge_or", "42", "\\boxed{40 \u2013 45}", 0),  # a range
    Case("hedge_or", "42", "The answer is 41 to 43.", 0),
    Case("hedge_markers", "42", "\\boxed{42} \\boxed{43}", 0),
    Case("hedge_markers", "42", "\\boxed{43} \\boxed{42}", 0),
    Case("hedge_markers", "42", "#### 42\n#### 43", 0),
    Case("hedge_markers", "42", "#### 43\n#### 42", 0),
    Case("hedge_markers", "42", "<answer>42</answer><answer>43</answer>", 0),
    Case("hedge_markers", "42", "<answer>43</answer><answer>42</answer>", 0),
    Case("hedge_markers", "42", "<answer>41</answer> \\boxed{42}", 0),
    Case("hedge_markers", "42", "\\boxed{42}\n#### 41", 0),
    Case("hedge_markers", "42", "The answer is 42.\nFinal answer: 24", 0),
    Case("hedge_markers", "42", "The answer is 24. The answer is 42.", 0),
    Case("hedge_markers", "42", "#### 42 ... or rather #### 43", 0),
    Case("hedge_list", "42", "\\boxed{40, 41, 42, 43}", 0),
    Case("hedge_list", "42", "#### 41 42 43", 0),
    Case("hedge_list", "42", "<answer>" + " ".join(str(i) for i in range(1, 101)) + "</answer>", 0),
    Case("hedge_list", "42", "The answer is 41, 42, 43.", 0),
    Case("hedge_list", "42", "\\boxed{42; 43}", 0),
    Case("hedge_list", "42", "\\boxed{42 and 43}", 0),
    Case("hedge_list", "3", "\\boxed{x=3, y=4}", 0),
    Case("hedge_list", "42", "<answer>Tom has 42 apples and 43 pears</answer>", 0),
    # ------------------------------------------------------------------ no final-answer marker
    Case("no_marker", "42", "The answer is 41 apples. (Check: 41 + 1 = 42)", 0),
    Case("no_marker", "42", "Let's compute. 6 * 7 = 42", 0),
    Case("no_marker", "42", "First, 40 + 2 = 42, then we subtract 1 from", 0),  # truncated
    Case("no_marker", "42", "1 2 3 4 5 6 7 8 9 10 ... 40 41 42", 0),
    Case("no_marker", "42", "42", 0),
    Case("no_marker", "42", "I think it is 41, no wait, 42.", 0),
    Case("no_marker", "42", "The number of apples is unknown; 42 might be close.", 0),
    Case("fallback", "42", "She has 6 * 7 apples.\nSo 42 in total.", 1, fallback="last_number"),
    Case("fallback", "42", "42", 1, fallback="last_number"),
    Case("fallback", "42", "Total: 42 apples.", 1, fallback="last_number"),
    Case("fallback", "42", "So far: 40 + 2 = 42", 0, fallback="last_number"),  # several numbers in the last sentence
    Case("fallback", "42", "1 2 3 4 5 6 7 8 9 10 ... 40 41 42", 0, fallback="last_number"),
    Case("fallback", "42", "It is 41. Check: 41 + 1 = 42", 0, fallback="last_number"),
    Case("fallback", "42", "The answer is 41. Then 42 is next.", 0, fallback="last_number"),  # a marker: no fallback
    Case("fallback", "42", "We got 42, then added 1 to get 43.", 0, fallback="last_number"),
    # ------------------------------------------------------------------ how numbers are written
    Case("number_minus", "-5", "\\boxed{\u22125}", 1),  # U+2212
    Case("number_minus", "-5", "#### \u20135", 1),  # en dash used as a minus
    Case("number_minus", "5", "\\boxed{\u22125}", 0),
    Case("number_minus", "5", "#### \u20135", 0),
    Case("number_minus", "-5", "\\boxed{-5}", 1),
    Case("number_commas", "15", "\\boxed{1,5}", 0),
    Case("number_commas", "1.5", "\\boxed{1,5}", 0),
    Case("number_commas", "12", "\\boxed{1, 2}", 0),
    Case("number_commas", "1000", "\\boxed{1{,}000}", 1),
    Case("number_commas", "1000", "\\boxed{1,000}", 1),
    Case("number_commas", "1000", "\\boxed{1\\,000}", 1),
    Case("number_commas", "100", "\\boxed{1,00}", 0),
    Case("number_commas", "12345", "#### 12,34,5", 0),
    Case("number_percent", "0.5", "\\boxed{0.5\\%}", 0),
    Case("number_percent", "0.5", "#### 0.5%", 0),
    Case("number_percent", "0.5", "#### 50%", 1),
    Case("number_percent", "50", "The answer is 50%.", 1, prompt="What percentage of the class passed?"),
    Case("number_percent", "50", "The answer is 50%.", 0, prompt="How many students passed?"),
    Case("number_percent", "50\\%", "#### 50", 1),
    Case("number_percent", "25", "#### 25 percent", 1, prompt="What percent of the pie is left?"),
    Case("number_sci", "1500", "#### 1.5e3", 1),
    Case("number_sci", "3", "#### 1.5e3", 0),
    Case("number_sci", "1.5", "#### 1.5e3", 0),
    Case("number_sci", "0.00012", "\\boxed{1.2E-4}", 1),
    Case("number_sci", "1.2", "\\boxed{1.2E-4}", 0),
    Case("number_decimal", "0.25", "\\boxed{.25}", 1),
    Case("number_decimal", "0.25", "\\boxed{1/4}", 1),
    Case("number_decimal", "2", "\\boxed{2.000}", 1),
    Case("number_decimal", "2", "\\boxed{2.0001}", 0),
    Case("number_decimal", "0.1", "\\boxed{0.10}", 1),
    # ------------------------------------------------------------------ equations in the answer
    Case("equation", "42", "\\boxed{41 = 42}", 0),
    Case("equation", "42", "\\boxed{42 = 41}", 0),
    Case("equation", "42", "#### 40 + 1 = 42", 0),
    Case("equation", "42", "\\boxed{6 \\times 7 = 42}", 1),
    Case("equation", "42", "The answer is x = 42.", 1),
    Case("equation", "42", "\\boxed{x = 41}", 0),
    Case("equation", "5", "\\boxed{a + b = 5}", 1),
    # ------------------------------------------------------------------ units and text
    Case("units", "42", "\\boxed{42\\text{ apples}}", 1),
    Case("units", "42", "\\boxed{42 \\mbox{ cm}}", 1),
    Case("units", "42", "\\boxed{42\\,\\text{cm}^2}", 1),
    Case("units", "42", "#### 42 km/h", 1),
    Case("units", "42", "\\boxed{\\$42}", 1),
    Case("units", "42", "\\boxed{42\\text{ apples and } 3\\text{ pears}}", 0),
    Case("units", "42", "\\boxed{\\text{forty-two}}", 1, known_miss="numbers in words are not read"),
    # ------------------------------------------------------------------ answers echoed from the prompt
    Case("echo", "7", FEWSHOT.split("\n\n")[0] + "\nAnn has 7 pens.", 0, prompt=FEWSHOT),
    Case(
        "echo",
        "7",
        "Example: Sam has 3 apples and buys 4 more. How many?\nThe answer is 7.\nAnn: 5 + 2 = 8.\nThe answer is 8.",
        0,
        prompt=FEWSHOT,
    ),
    Case("echo", "7", "Ann has 5 + 2 = 7 pens. The answer is 7.", 1, prompt=FEWSHOT),
    Case("echo", "7", "The answer is 7.", 1, prompt=FEWSHOT),  # the same words as the example's, but alone: the model's own
    # ------------------------------------------------------------------ negation, emptiness, truncation
    Case("negation", "42", "The answer is not 42.", 0),
    Case("negation", "42", "\\boxed{\\text{not } 42}", 0),
    Case("negation", "42", "<answer>It isn't 42</answer>", 0),
    Case("negation", "42", "The answer is not 41, it is 42. \\boxed{42}", 1),
    Case("truncated", "42", "Adding them: \\boxed{4", 0),
    Case("truncated", "42", "<answer>42", 0),
    Case("truncated", "42", "The answer is the number of apples, which we compute as", 0),
    Case("empty", "42", "<answer></answer>", 0),
    Case("empty", "42", "\\boxed{} 42", 0),
    # ------------------------------------------------------------------ nesting and odd markup
    Case("nested", "4", "<answer>\\boxed{4}</answer>", 1),
    Case("nested", "4", "<answer>The sum is \\boxed{4}</answer>", 1),
    Case("nested", "4", "\\boxed{\\boxed{4}}", 1),
    Case("nested", "4", "<answer>\\boxed{4} \\boxed{5}</answer>", 0),
    Case("nested", "4", "\\fbox{4}", 1),
    Case("nested", "4", "**\\boxed{4}**", 1),
    Case("nested", "4", "$$\\boxed{\\displaystyle 4}$$", 1),
    # ------------------------------------------------------------------ pathological (each within the time limit, 0)
    Case("huge", "1", "\\boxed{9^{9^{9}}}", 0),
    Case("huge", "1", "\\boxed{" + "9" * 50_000 + "}", 0),
    Case("huge", "1", "#### " + "9" * 50_000, 0),
    Case("huge", "1", "\\boxed{" + "(" * 100 + "1" + ")" * 100 + "}", 1),  # deep but short: still 1
    Case("huge", "1", "The answer is 1e999999999.", 0),
    Case("huge", "1", "\\boxed{" + "(1+" * 70 + "1" + ")" * 70 + "}", 0),  # 71; math-verify's parser once read it as 1
    Case("huge", "1", "\\boxed{" * 2000 + "1" + "}" * 2000, 0),  # 2000 nested boxes (too long to be an answer)
]
