"""rollout.repetition_penalty (TRL's repetition_penalty) in the hf engine: each sampled token's log-prob is that of
transformers' RepetitionPenaltyLogitsProcessor applied to the model's logits over the row's tokens so far (the
prompt without its padding, then the completion), at the sampling temperature, by a forward of the test's own."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from rlvr.models import resolve_model_path
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.rollout import SamplingParams, make_engine

PROMPTS = ["12+34=", "7-5=", "40+2+2+2="]


@pytest.mark.parametrize("penalty, temperature", [(1.5, 1.0), (0.7, 1.3)])
def test_sampled_log_probs_are_transformers_penalized_distribution(penalty, temperature):
    tok = load_tokenizer(resolve_model_path("tiny"))[0]
    model = load_model(resolve_model_path("tiny")).eval()
    params = SamplingParams(n=3, temperature=temperature, max_new_tokens=6, repetition_penalty=penalty)
    gen = make_engine("hf", model, tok).generate(PROMPTS, params, seeds=[1, 2, 3])
    plain = make_engine("hf", model, tok).generate(PROMPTS, SamplingParams(n=3, temperature=temperature, max_new_tokens=6), seeds=[1, 2, 3])
    assert gen.texts != plain.texts  # the penalty changed what was drawn
    processor = RepetitionPenaltyLogitsProcessor(penalty)
    checked = 0
    for r in range(len(gen.texts)):
        prompt = gen.prompt_ids[r][gen.prompt_mask[r].bool()]
        completion = gen.completion_ids[r][gen.completion_mask[r].bool()]
        ids = torch.cat([prompt, completion])[None]
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # [C, V]: position t predicts completion token t
        for t, token in enumerate(completion.tolist()):
            scores = processor(ids[:, : len(prompt) + t], logits[t : t + 1].clone())
            expected = (scores / temperature).log_softmax(-1)[0, token]
            assert abs(float(gen.sampling_logprobs[r, t]) - float(expected)) < 1e-4, (r, t)
            checked += 1
    assert checked > 20


def test_multi_turn_episodes_penalize_every_token_so_far_the_tools_too():
    """guess_number with the bundled tiny-tools model: each sampled token's log-prob is the processor's over the
    episode's ids so far, the tools' results included (as transformers reads a whole conversation's ids)."""
    from rlvr.rollout.engines.hf import HFEngine
    from rlvr.rollout.sources.multi_turn import MultiTurnSource, make_format
    from rlvr.tasks import guess_number as gn
    from rlvr.tasks.guess_number import GuessNumber
    from rlvr.tools import EnvironmentFactory, ToolRunner

    tok = load_tokenizer("tiny-tools")[0]
    model = load_model("tiny-tools").eval()
    env = EnvironmentFactory(GuessNumber)
    tags = {"tags": {}, "result_tags": ("<result>", "</result>"), "describe": False}  # as tiny-tools learnt them
    fmt = make_format("tags", tok, tool_names=env.names, schemas=env.schemas, **tags)
    penalty, temperature = 1.3, 1.0
    params = SamplingParams(n=2, temperature=temperature, max_new_tokens=120, repetition_penalty=penalty)
    runner = ToolRunner(timeout_s=30)
    source = MultiTurnSource(HFEngine(model, tok), tok, params, fmt=fmt, environment=env, runner=runner, max_turns=3)
    with runner:
        e = source.rollout([gn.row(t) for t in (7, 22)], [5, 6])
    processor, checked, external = RepetitionPenaltyLogitsProcessor(penalty), 0, 0
    for r in range(e.completion_ids.shape[0]):
        prompt = e.prompt_ids[r][e.prompt_mask[r].bool()]
        n = int(e.attention_mask[r].sum())
        ids = torch.cat([prompt, e.completion_ids[r, :n]])[None]
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        for t in range(n):
            if not e.loss_mask[r, t]:
                external += 1
                continue
            scores = processor(ids[:, : len(prompt) + t], logits[t : t + 1].clone())
            expected = (scores / temperature).log_softmax(-1)[0, int(e.completion_ids[r, t])]
            assert abs(float(e.sampling_logprobs[r, t]) - float(expected)) < 1e-4, (r, t)
            checked += 1
    assert checked > 40 and external > 10  # model tokens after tool results were checked
