"""Metrics that tell the truth: clip fractions averaged over the
mu passes with min/max over what can clip, the learning rate the update used, the generated and
the kept view of the rewards under dynamic sampling, entropy over every sampled token (also when
no row is trained), held-out evaluation with the training system prompt, the arithmetic split
holding out unordered pairs, old log-probs without dropout (as the sampler), and the docs.

Every test uses the session's tiny random model (conftest's make_trainer: 4 prompts x G=4,
4 new tokens) and compares against values recomputed here from what the trainer handed the loss
or from a fresh forward of the same model.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import math
import torch

from rlvr import algo
from rlvr.models.forward import completion_logprobs
from test_trainer_variants import CHECKSUM, CONSTANT, PARITY, reward_file
from _paths import REPO

G = 4
pytestmark = pytest.mark.filterwarnings("ignore:Seems like `optimizer.step")


def _sampled_entropy(model, e, rows=None, temperature: float = 1.0) -> float:
    """Mean entropy over the loss-mask tokens of `rows` (all by default), from a fresh eval-mode forward."""
    rows = torch.arange(len(e)) if rows is None else rows
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = completion_logprobs(
            model,
            e.prompt_ids[rows],
            e.prompt_mask[rows],
            e.completion_ids[rows],
            e.attention_mask[rows],
            temperature=temperature,
            with_entropy=True,
        )
    model.train(was_training)
    m = e.loss_mask[rows].double()
    return float((out.entropy.double() * m).sum() / m.sum())


# ---------------------------------------------------------------------------------------------
# clip fractions


class LossSpy:
    """Wraps algo.policy_loss: per call, the clip fractions, the token count and whether the old
    log-probs are the forward's own (then the ratio is exactly 1 and nothing can clip)."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = algo.policy_loss

        def wrapper(logp, old_logp, advantages, mask, norms, **kw):
            res = real(logp, old_logp, advantages, mask, norms, **kw)
            self.calls.append(
                dict(
                    fracs=[float(res.low_clipped), float(res.high_clipped), float(res.region_clipped)],
                    tokens=float(mask.sum()),
                    own=torch.equal(logp.detach(), old_logp),
                    num_tokens=norms.num_tokens,
                )
            )
            return res

        monkeypatch.setattr(algo, "policy_loss", wrapper)


@pytest.mark.parametrize("micro_batch", [0, 5])
def test_clip_fractions_are_means_over_the_passes_and_min_max_over_what_can_clip(make_trainer, monkeypatch, micro_batch):
    mu = 3
    t = make_trainer(
        "optim.lr=0.05",
        "optim.max_grad_norm=0",
        f"algo.num_iterations={mu}",
        f"optim.micro_batch_size={micro_batch}",
        "optim.skip_zero_advantage=false",
        "rollout.ignore_eos=true",
    )  # no 1-token micro-batch that cannot clip
    spy = LossSpy(monkeypatch)
    episodes = t.collector.collect(t.state).episodes
    # signs alternate: every micro-batch has completions pushed down (the ones that can clip low)
    adv = torch.randn(len(episodes), generator=torch.Generator().manual_seed(5)).abs() * (-1) ** torch.arange(len(episodes))
    m = t.updater(episodes, adv).metrics
    T = spy.calls[0]["num_tokens"]
    for k, name in enumerate(("low_mean", "high_mean", "region_mean")):
        expected = sum(c["fracs"][k] * c["tokens"] for c in spy.calls) / (mu * T)
        assert m[f"clip_ratio/{name}"] == pytest.approx(expected, rel=1e-9, abs=1e-12), name
        assert 0 <= m[f"clip_ratio/{name}"] <= 1
    can_clip = [c for c in spy.calls if not c["own"]]
    assert len(can_clip) == (mu - 1) * len(spy.calls) // mu  # pass 1 (ratio exactly 1) cannot clip
    low_min = min(c["fracs"][0] for c in can_clip)
    assert low_min > 0, "the scenario should clip low in every micro-batch of passes 2..mu"
    assert m["clip_ratio/low_min"] == pytest.approx(low_min, abs=1e-12)
    assert m["clip_ratio/high_max"] == pytest.approx(max(c["fracs"][1] for c in can_clip), abs=1e-12)


def test_clip_min_max_with_one_pass_are_zero(make_trainer):
    """mu = 1: the ratio is exactly 1 everywhere, nothing can clip, and every clip metric is 0."""
    t = make_trainer("optim.skip_zero_advantage=false")
    episodes = t.collector.collect(t.state).episodes
    m = t.updater(episodes, torch.randn(len(episodes), generator=torch.Generator().manual_seed(1))).metrics
    assert [m[f"clip_ratio/{k}"] for k in ("low_mean", "low_min", "high_mean", "high_max", "region_mean")] == [0.0] * 5


# ---------------------------------------------------------------------------------------------
# learning rate


@pytest.mark.parametrize("mu", [1, 2])
def test_logged_learning_rate_is_the_one_the_update_used(make_trainer, mu):
    lr, warmup = 1e-3, 4
    t = make_trainer(f"optim.lr={lr}", f"optim.warmup_steps={warmup}", f"algo.num_iterations={mu}", "save_every=0")
    used, real_step = [], t.optimizer.step

    def step(*a, **k):
        used.append(t.optimizer.param_groups[0]["lr"])
        return real_step(*a, **k)

    t.optimizer.step = step
    for n in range(2):
        m = t.train_step()
        assert len(used) == mu * (n + 1)
        assert m["learning_rate"] == pytest.approx(sum(used[-mu:]) / mu, rel=1e-12)
        # the warm-up schedule: update u uses lr * (u + 1) / warmup
        assert m["learning_rate"] == pytest.approx(lr * sum(u + 1 for u in range(n * mu, (n + 1) * mu)) / (mu * warmup), rel=1e-12)


def test_a_resume_with_more_steps_follows_the_new_schedule_from_its_next_update(make_trainer, tmp_path):
    """steps=4 resumed as steps=6 under a cosine schedule: the warning says from which step the rates follow the
    6-step schedule, and that step's update uses it (the optimizer's saved rate is the 4-step schedule's)."""
    from rlvr.training.run_control import lr_lambda

    lr, common = 1e-3, ("optim.lr=1e-3", "optim.lr_schedule=cosine", "optim.warmup_steps=2", "optim.min_lr_rate=0.1")
    make_trainer(*common, "steps=4", run="sched").train()
    t = make_trainer(*common, "steps=6", "resume=auto", run="sched")
    assert any("optim.lr_schedule=cosine was laid out for 4 steps; from step 5 it follows the one for steps=6" in w for w in t.warnings)
    rates = [t.train_step()["learning_rate"] for _ in range(2)]
    new = lr_lambda("cosine", 2, 6, min_lr_rate=0.1)
    assert rates == pytest.approx([lr * new(4), lr * new(5)], rel=1e-12)
    assert lr * lr_lambda("cosine", 2, 4, min_lr_rate=0.1)(4) == pytest.approx(1e-4)  # what step 5 used before: the old end


# ---------------------------------------------------------------------------------------------
# dynamic sampling: the generated and the kept view


def test_dynamic_sampling_logs_the_generated_and_the_kept_rewards(make_trainer, tmp_path):
    """PARITY: even answers give every completion 0.5 (no signal), odd ones 0, 1/G, 2/G, 3/G."""
    t = make_trainer(reward_file(tmp_path, PARITY, "parity"), "algo.dynamic_sampling=true", "algo.max_resample_rounds=8")
    m = t.train_step()
    drawn = [t.task.train_row(p) for p in range(m["sampling/prompts_consumed"])]
    per_group = [[0.5] * G if int(r["answer"]) % 2 == 0 else [i / G for i in range(G)] for r in drawn]
    flat = torch.tensor(per_group, dtype=torch.float64)
    assert m["sampling/rounds"] > 1, "the scenario should resample"
    assert m["reward"] == pytest.approx(float(flat.mean()), abs=1e-7)
    assert m["rewards/parity/mean"] == pytest.approx(float(flat.mean()), abs=1e-7)
    assert m["reward_std"] == pytest.approx(float(flat.std()), abs=1e-7)  # TRL 1.16: the whole batch, Bessel-corrected
    assert m["frac_reward_zero_std"] == pytest.approx(sum(int(r["answer"]) % 2 == 0 for r in drawn) / len(drawn), abs=1e-7)  # float32 mean
    assert m["sampling/kept_reward"] == pytest.approx(sum(range(G)) / G**2, abs=1e-7)  # kept groups: odd answers only
    assert m["sampling/kept_frac_reward_zero_std"] == 0.0


def test_without_dynamic_sampling_no_kept_view(make_trainer, tmp_path):
    t = make_trainer(reward_file(tmp_path, PARITY, "parity"))
    m = t.train_step()
    assert not any(k.startswith("sampling/kept") for k in m)


# ---------------------------------------------------------------------------------------------
# entropy over every sampled token


@pytest.mark.parametrize("sampler_entropy", [True, False])  # False: a source that gives none (vLLM, multi-turn)
@pytest.mark.parametrize("skip", [True, False])
def test_entropy_is_over_every_sampled_token(make_trainer, sampler_entropy, skip):
    # the bundled model: its entropies differ from token to token (the random one's are all near ln V)
    t = make_trainer("model.path=tiny", "rollout.temperature=0.7", f"optim.skip_zero_advantage={str(skip).lower()}")
    e = t.collector.collect(t.state).episodes
    assert (e.sampling_entropy is not None) and e.sampling_entropy.shape == e.loss_mask.shape
    if not sampler_entropy:
        e = dataclasses.replace(e, sampling_entropy=None)
    adv = torch.tensor([0.0] * 4 + [1.0, -1.0, 0.5, -0.5] + [0.0] * 4 + [0.3, 0.0, -0.3, 0.0])
    expected_all = _sampled_entropy(t.model, e, temperature=0.7)
    expected_trained = _sampled_entropy(t.model, e, rows=(adv != 0).nonzero().squeeze(-1) if skip else None, temperature=0.7)
    assert not skip or abs(expected_all - expected_trained) > 1e-3, "the scenario should tell the two apart"
    m = t.updater(e, adv).metrics
    assert m["entropy"] == pytest.approx(expected_all, abs=1e-5)
    assert m["entropy/trained"] == pytest.approx(expected_trained, abs=1e-5)


@pytest.mark.parametrize("sampler_entropy", [True, False])
def test_entropy_when_no_row_is_trained(make_trainer, sampler_entropy):
    t = make_trainer()
    e = t.collector.collect(t.state).episodes
    if not sampler_entropy:
        e = dataclasses.replace(e, sampling_entropy=None)
    expected = _sampled_entropy(t.model, e)
    m = t.updater(e, torch.zeros(len(e))).metrics
    assert m["entropy"] == pytest.approx(expected, abs=1e-5) and expected > 0.1
    assert "entropy/trained" not in m  # nothing was trained: unknown, not 0


@pytest.mark.parametrize("sampler_entropy", [True, False])
def test_entropy_with_minibatches_is_over_the_whole_generated_batch(make_trainer, tmp_path, sampler_entropy):
    """optim.steps_per_generation=2: the logged `entropy` covers every sampled token of the
    whole batch under the policy that generated it: not only the last minibatch's, nor measured after
    the first minibatch's optimizer step moved the weights (lr 0.05 moves them measurably here)."""
    t = make_trainer(
        "model.path=tiny",
        "rollout.temperature=0.7",
        "optim.steps_per_generation=2",
        "optim.lr=0.05",
        reward_file(tmp_path, CHECKSUM, "checksum"),
    )
    if not sampler_entropy:  # a source that gives none (vLLM, multi-turn): the trainer's own forwards measure it
        rollout = t.source.rollout
        t.source.rollout = lambda rows, seeds: dataclasses.replace(rollout(rows, seeds), sampling_entropy=None)
    generating = copy.deepcopy(t.model)
    m = t.train_step()
    e = t.last_step.batch.episodes
    assert (e.sampling_entropy is not None) == sampler_entropy and t.scheduler.last_epoch == 2  # two optimizer steps
    expected = _sampled_entropy(generating, e, temperature=0.7)
    last_minibatch = torch.arange(len(e) // 2, len(e))  # 2 of the 4 groups
    assert abs(expected - _sampled_entropy(generating, e, rows=last_minibatch, temperature=0.7)) > 1e-3
    assert abs(expected - _sampled_entropy(t.model, e, temperature=0.7)) > 1e-3  # the weights after the update
    assert m["entropy"] == pytest.approx(expected, abs=1e-5)


def test_hf_sampler_entropy_is_the_training_distributions(make_trainer):
    """The sampler's entropies are those of the unfiltered distribution at the sampling
    temperature (the training forward's), also when top-k/top-p filter what is sampled."""
    t = make_trainer("rollout.temperature=0.8", "rollout.top_k=5", "rollout.top_p=0.9")
    e = t.collector.collect(t.state).episodes
    with torch.no_grad():
        out = completion_logprobs(
            t.model, e.prompt_ids, e.prompt_mask, e.completion_ids, e.attention_mask, temperature=0.8, with_entropy=True
        )
    m = e.loss_mask.bool()
    torch.testing.assert_close(e.sampling_entropy[m], out.entropy[m], rtol=0, atol=1e-5)
    assert (e.sampling_entropy[~m] == 0).all()


def test_cli_run_with_no_signal_logs_the_true_entropy(rlvr_cli, tiny_model_dir, tmp_path):
    """Every group has equal rewards, so no row is trained; the run's metrics.jsonl
    holds the sampled tokens' entropy (the untrained model's, well above 0), never 0.000."""
    out = tmp_path / "run"
    rlvr_cli(
        "train",
        f"model.path={tiny_model_dir}",
        "steps=2",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=4",
        "eval_before_after=false",
        "report_to=[]",
        f"output_dir={out}",
        reward_file(tmp_path, CONSTANT, "constant"),
        check=True,
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["frac_reward_zero_std"] for r in rows] == [1.0, 1.0]
    assert all(r["entropy"] > 1.0 for r in rows), [r["entropy"] for r in rows]  # random tiny model: ~ln(V)
    assert all("entropy/trained" not in r for r in rows)


# ---------------------------------------------------------------------------------------------
# held-out evaluation and the arithmetic split


def prompts_generated(t) -> list[str]:
    """The prompts the trainer's engine is asked to generate from, from now on, in order (its generate wrapped)."""
    seen, real = [], t.engine.generate

    def generate(prompts, params, seeds):
        seen.extend(prompts)
        return real(prompts, params, seeds)

    t.engine.generate = generate
    return seen


def test_held_out_evaluation_uses_the_system_prompt(make_trainer):
    from rlvr.data import render_prompt

    t = make_trainer("data.system_prompt=Answer with the number only.", "data.eval_size=6", "eval_before_after=true")
    seen = prompts_generated(t)
    t.evaluate()
    expected = [render_prompt(r["prompt"], t.tokenizer, "Answer with the number only.") for r in t.task.eval_rows()]
    assert seen == expected and "Answer with the number only." in seen[0]


@pytest.mark.parametrize("op", ["+", "*"])
def test_arithmetic_holds_out_unordered_pairs(op):
    from rlvr.tasks import arithmetic as ar

    for a in range(10, 100):
        for b in range(a + 1, 100):
            assert ar.is_held_out(ar.Problem(a, op, b)) == ar.is_held_out(ar.Problem(b, op, a)), (a, op, b)
    held = sum(ar.is_held_out(ar.Problem(a, op, b)) for a in range(10, 100) for b in range(10, 100)) / 90**2
    assert 0.08 < held < 0.12  # still about HELD_OUT_PERCENT


def test_no_held_out_addition_is_trained_in_swapped_form():
    from rlvr.tasks import arithmetic as ar

    held = {(p.a, p.b) for p in ar.eval_problems(500) if p.op == "+"}
    trained = {(p.a, p.b) for i, p in zip(range(4800), ar.problems("train", seed=0)) if p.op == "+"}
    assert not {(b, a) for a, b in held} & trained


def test_multiplication_holds_out_unordered_pairs():
    from rlvr.tasks import multiplication as mul

    for a in range(100, 1000, 7):
        for b in range(100, 1000, 11):
            assert mul.is_held_out(mul.Problem(a, b)) == mul.is_held_out(mul.Problem(b, a)), (a, b)


# ---------------------------------------------------------------------------------------------
# dropout: old and reference log-probs as the sampler sees the policy (no dropout)


@pytest.fixture(scope="module")
def dropout_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with attention dropout 0.5 (a hub model with dropout in its config)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("tiny_dropout")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attention_dropout=0.5)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(path)
    return str(path)


def _eval_logp(model, e):
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = completion_logprobs(model, e.prompt_ids, e.prompt_mask, e.completion_ids, e.attention_mask)
    model.train(was_training)
    return out.logp


@pytest.mark.parametrize("kind", ["attention", "lora"])
def test_old_logprobs_are_the_policy_without_dropout(make_trainer, dropout_model_dir, monkeypatch, kind):
    over = [f"model.path={dropout_model_dir}"] if kind == "attention" else ["model.lora.r=4", "model.lora.dropout=0.5"]
    t = make_trainer(*over, "algo.num_iterations=2", "optim.skip_zero_advantage=false")
    if kind == "lora":  # B starts at 0, which would hide the adapter's dropout
        torch.manual_seed(0)
        for n, p in t.model.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.5)
    assert t.updater.dropout
    spy, real = [], algo.policy_loss
    monkeypatch.setattr(algo, "policy_loss", lambda logp, old, *a, **k: spy.append((logp.detach(), old)) or real(logp, old, *a, **k))
    e = t.collector.collect(t.state).episodes
    expected_old = _eval_logp(t.model, e)
    m = t.updater(e, torch.randn(len(e), generator=torch.Generator().manual_seed(2))).metrics
    mask = e.loss_mask.bool()
    for _, old in spy:  # both passes: the generating policy without dropout
        torch.testing.assert_close(old[mask], expected_old[mask], rtol=0, atol=1e-6)
    assert (spy[0][0] - spy[0][1])[mask].abs().max() > 1e-3  # pass 1's ratio carries the dropout noise
    assert m["sampling/sampling_logp_difference/mean"] < 1e-5  # the sampler and the old log-probs agree


def test_reference_logprobs_without_dropout(make_trainer, dropout_model_dir):
    t = make_trainer(f"model.path={dropout_model_dir}", "model.lora.r=4", "algo.beta=0.04")
    e = t.collector.collect(t.state).episodes.to(t.device)
    ref = t.updater.reference_logprobs(e, [slice(0, len(e))])
    with t.policy.reference() as model:
        expected = _eval_logp(model, e)
    mask = e.loss_mask.bool()
    torch.testing.assert_close(ref[mask], expected[mask], rtol=0, atol=1e-6)
    assert t.model.training  # left in training mode


def test_without_dropout_no_extra_forward(make_trainer):
    """The default tiny model has no dropout: old log-probs are pass 1's own (one forward per pass)."""
    t = make_trainer("algo.num_iterations=2", "optim.skip_zero_advantage=false", "optim.shared_prefix=false")
    assert not t.updater.dropout
    e = t.collector.collect(t.state).episodes
    calls = []
    hook = t.model.register_forward_hook(lambda *a: calls.append(1))
    t.updater(e, torch.randn(len(e), generator=torch.Generator().manual_seed(2)))
    hook.remove()
    assert len(calls) == 2


# ---------------------------------------------------------------------------------------------
# docs


def test_algorithms_doc_describes_the_lora_reference():
    text = (REPO / "docs" / "algorithms.md").read_text()
    kl = text[text.index("## 7. KL penalty") : text.index("## 8.")]
    assert "Not yet implemented" not in kl
    assert "adapter disabled" in kl


def test_chat_template_kwargs_reach_every_prompt_rendering(make_trainer, tiny_model_dir, tmp_path):
    """data.chat_template_kwargs (TRL's chat_template_kwargs) are variables of the chat template at every rendering:
    the training prompts and the held-out ones; the run's tokenizer files stay as they were."""
    import shutil

    from transformers import AutoTokenizer

    from rlvr.models.loading import with_template_kwargs
    from rlvr.models.tokenizer import CHAT_TEMPLATE

    model = tmp_path / "thinking"
    shutil.copytree(tiny_model_dir, model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = CHAT_TEMPLATE + "{% if enable_thinking is defined and not enable_thinking %}{{ 'no!' }}{% endif %}"
    tok.save_pretrained(model)
    kwargs = "data.chat_template_kwargs={enable_thinking: false}"
    t = make_trainer(f"model.path={model}", kwargs, "data.eval_size=3", "eval_before_after=true")
    seen = prompts_generated(t)
    t.train_step()
    t.evaluate()
    assert len(seen) == t.cfg.rollout.prompts_per_step + 3 and all(p.endswith("<|assistant|>no!") for p in seen), seen[:2]
    assert (
        not AutoTokenizer.from_pretrained(model).apply_chat_template([{"role": "user", "content": "1+1="}], tokenize=False).endswith("no!")
    )
    # a call's own value wins, and the tokenizer given is not changed
    wrapped = with_template_kwargs(tok, {"enable_thinking": False})
    messages = [{"role": "user", "content": "1+1="}]
    assert wrapped.apply_chat_template(messages, tokenize=False, enable_thinking=True) == tok.apply_chat_template(messages, tokenize=False)
    assert not tok.apply_chat_template(messages, tokenize=False).endswith("no!")


def test_completion_lengths_as_trl_logs_them(make_trainer):
    """completions/*_length over every completion, *_terminated_length over those that ended by themselves (TRL 1.16:
    0 when none did), counted in the model's own tokens."""
    t = make_trainer("rollout.max_new_tokens=6", "rollout.temperature=1.5")
    m = t.train_step()
    e = t.last_step.batch.episodes
    lengths, truncated = e.loss_mask.sum(-1).double(), e.truncated.bool()
    ended = lengths[~truncated]
    assert 0 < truncated.sum() < len(truncated), "the scenario should have both kinds"
    assert (m["completions/mean_length"], m["completions/max_length"]) == (float(lengths.mean()), float(lengths.max()))
    assert m["completions/mean_terminated_length"] == pytest.approx(float(ended.mean()), abs=1e-6)
    assert (m["completions/min_terminated_length"], m["completions/max_terminated_length"]) == (float(ended.min()), float(ended.max()))


def test_optim_eps_is_adamws_epsilon(make_trainer):
    t = make_trainer("optim.eps=1e-6")
    assert [g["eps"] for g in t.optimizer.param_groups] == [1e-6]


def test_min_p_samples_only_tokens_near_the_most_probable(make_trainer):
    """rollout.min_p: every sampled token had at least min_p x the most probable token's probability under the
    policy that sampled it at the sampling temperature (the bundled model, checked by a forward of its own); the
    sampler then is not the policy, so the old log-probs come from a forward."""
    from rlvr.models.forward import logits_plain

    min_p = 0.3
    t = make_trainer("model.path=tiny", f"rollout.min_p={min_p}", "rollout.temperature=2.0", "rollout.max_new_tokens=6", "steps=1")
    assert not t.updater.sampler_is_policy
    e = t.collector.collect(t.state).episodes
    ids = torch.cat([e.prompt_ids, e.completion_ids], 1)
    attn = torch.cat([e.prompt_mask, e.attention_mask], 1)
    C = e.completion_ids.shape[1]
    with torch.no_grad():
        logp = (logits_plain(t.model, ids, attn, C)[:, :C].float() / 2.0).log_softmax(-1)  # [N, C, V]
    chosen = logp.gather(-1, e.completion_ids[..., None]).squeeze(-1)
    ratio = (chosen - logp.amax(-1))[e.loss_mask.bool()]  # log(p / p_max) of each sampled token
    assert ratio.numel() > 40 and bool((ratio >= math.log(min_p) - 1e-4).all()), float(ratio.min())
