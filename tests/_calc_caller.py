"""A real tiny model that calls a calculator in the tag format: for each prompt it was trained on,
`<calc>a*b</calc>`, then, after the tool's `<result>c</result>`, the answer copied from the result.
Without the tool (single-turn) it has no result to copy: evaluations with and without tools differ."""

from __future__ import annotations

import json
from pathlib import Path

from _callers import train_caller
from rlvr.tasks import multiplication as mul
from rlvr.models.tokenizer import build_char_tokenizer

# the first three held-out multiplication problems, and 12*34
PROBLEMS = [(p.a, p.b) for p in mul.eval_problems(3)] + [(12, 34)]


def save_calc_caller(path: Path) -> Path:
    """Train it (a few seconds), save it to `path` with `data.jsonl`: four `12*34=` rows, answer 408."""
    tok = build_char_tokenizer()
    episodes = []
    for a, b in PROBLEMS:
        prompt = tok.apply_chat_template([{"role": "user", "content": f"{a}*{b}="}], add_generation_prompt=True, tokenize=False)
        episodes.append(
            [(prompt, False), (f"<calc>{a}*{b}</calc>", True), (f"<result>{a * b}</result>", False), (f"{a * b}{tok.eos_token}", True)]
        )
    model, loss = train_caller(tok, episodes, steps=300)
    assert loss < 0.01, loss
    model.save_pretrained(path)
    tok.save_pretrained(path)
    write_rows(path / "data.jsonl", ["408"] * 4)
    return path


def write_rows(path: Path, answers: list[str], column: str = "prompt") -> Path:
    """`12*34=` rows with these answers (the caller's answer is always 408), the prompt in `column`."""
    path.write_text("".join(json.dumps({column: [{"role": "user", "content": "12*34="}], "answer": a}) + "\n" for a in answers))
    return path
