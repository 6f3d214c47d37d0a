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
