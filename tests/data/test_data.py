"""Built-in arithmetic task, the resumable prompt stream, and dataset file loaders."""

import json

import pytest

from rlvr.data import PromptStream, load_rows, render_prompt
from rlvr.tasks import get_task
from rlvr.tasks.arithmetic import eval_problems, extract_answer, is_held_out, problem_at
from rlvr.data.loaders import DataError
from rlvr.models.tokenizer import build_char_tokenizer


def test_train_and_held_out_splits_are_disjoint_and_seeded():
    train = {problem_at(i, "train", seed=3) for i in range(3000)}
    test = set(eval_problems(200))
    assert not train & test
    assert all(not is_held_out(p) for p in train) and all(is_held_out(p) for p in test)
    assert [problem_at(i, "train", seed=3) for i in range(5)] == [problem_at(i, "train", seed=3) for i in range(5)]
    assert [problem_at(i, "train", seed=3) for i in range(5)] != [problem_at(i, "train", seed=4) for i in range(5)]


def test_difficulty_knobs():
    ps = [problem_at(i, "train", seed=0, digits=3, operators="*") for i in range(50)]
    assert all(p.op == "*" and 100 <= p.a <= 999 and 100 <= p.b <= 999 for p in ps)
    with pytest.raises(ValueError, match="operators"):
        problem_at(0, "train", seed=0, operators="/")


def test_verifier_is_strict():
    assert extract_answer(" 46 ") == "46"
    assert extract_answer("46 47") is None  # listing several answers earns nothing
    assert extract_answer("-3") == "-3"


def test_stream_position_is_the_whole_state():
    rows = [{"prompt": f"q{i}"} for i in range(5)]
    s = PromptStream.from_rows(rows, seed=1)
    first = [r["prompt"] for r in s.take(12)]
    assert sorted(first[:5]) == sorted(r["prompt"] for r in rows)  # an epoch is a permutation
    t = PromptStream.from_rows(rows, seed=1)
    t.load_state_dict({"position": 7})
    assert [r["prompt"] for r in t.take(5)] == first[7:12]


def test_task_rows_carry_the_answer_column():
    task = get_task("arithmetic", seed=0, eval_size=10)
    row = task.train_row(0)
    assert set(row) == {"prompt", "answer"} and row["prompt"][0]["role"] == "user"
    assert len(task.eval_rows()) == 10


def test_jsonl_csv_parquet_loaders(tmp_path):
    rows = [{"question": "1+1=", "answer": "2"}, {"question": "2+2=", "answer": "4"}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "d.csv").write_text("question,answer\n1+1=,2\n2+2=,4\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    for name in ("d.jsonl", "d.csv", "d.parquet"):
        got = load_rows(str(tmp_path / name), prompt_column="question")
        assert got == [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}], name


def test_datasets_folder_loader(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"prompt": "3+3=", "answer": "6"}]).save_to_disk(str(tmp_path / "ds"))
    assert load_rows(str(tmp_path / "ds")) == [{"prompt": "3+3=", "answer": "6"}]


def test_loader_errors_name_the_place(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(DataError, match=r"bad.jsonl:2"):
        load_rows(str(bad))
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"question": "a"}\n')
    with pytest.raises(DataError, match=r"no prompt column 'prompt'.*\['question'\]"):
        load_rows(str(ok))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="empty"):
        load_rows(str(empty))


def test_chat_template_is_applied():
    tok = build_char_tokenizer()
    assert render_prompt("1+2=", tok) == "<|user|>1+2=<|assistant|>"
    assert render_prompt("1+2=", tok, system_prompt="be brief") == "<|system|>be brief<|user|>1+2=<|assistant|>"


def test_eval_size_larger_than_the_held_out_split_is_refused():
    with pytest.raises(ValueError, match=r"data.eval_size=50 is more than the \d+ distinct held-out problems"):
        eval_problems(50, digits=1)


def test_datasets_subset_is_passed_through(tmp_path):
    """data.subset picks a `datasets` configuration, the way openai/gsm8k has `main` and
    `socratic` (here a local folder laid out like that hub repo)."""
    import json

    for name, q in (("main", "How many?"), ("socratic", "How many? Ask yourself first.")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.jsonl").write_text(json.dumps({"question": q, "answer": "3 + 4 = 7\n#### 7"}) + "\n")
    (tmp_path / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: main\n  data_files:\n  - split: train\n    path: main/train.jsonl\n"
        "- config_name: socratic\n  data_files:\n  - split: train\n    path: socratic/train.jsonl\n---\n"
    )
    main = load_rows(str(tmp_path), prompt_column="question", subset="main")
    socratic = load_rows(str(tmp_path), prompt_column="question", subset="socratic")
    assert [r["prompt"] for r in main] == ["How many?"]
    assert [r["prompt"] for r in socratic] == ["How many? Ask yourself first."]
