"""Every fast path of the update against the plain path: same log-probs (1e-5, fp32), same loss
and gradients (shared-prefix forward, zero-advantage skip), bf16 autocast close to fp32."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlvr.models.forward import completion_logprobs, group_runs

pytestmark = pytest.mark.filterwarnings("ignore:Seems like `optimizer.step")


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg).train()


def _batch(G=3, B=3, P=7, C=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    lens = [P, P - 3, P - 1][:B]
    p_ids = torch.zeros(B, P, dtype=torch.long)
    p_mask = torch.zeros(B, P, dtype=torch.long)
    for i, n in enumerate(lens):  # left padding of different widths
        p_ids[i, P - n :] = torch.randint(1, 50, (n,), generator=g)
        p_mask[i, P - n :] = 1
    p_ids, p_mask = p_ids.repeat_interleave(G, 0), p_mask.repeat_interleave(G, 0)
    c_ids = torch.randint(1, 50, (B * G, C), generator=g)
    c_len = torch.randint(1, C + 1, (B * G,), generator=g)
    c_mask = (torch.arange(C)[None] < c_len[:, None]).long()
    c_ids = c_ids.masked_fill(c_mask == 0, 0)
    return p_ids, p_mask, c_ids, c_mask


def _grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _group_ids(n_rows, G):
    """[N] consecutive rows of a prompt share a group id, as _batch repeats each prompt G times."""
    return torch.arange(n_rows) // G


def test_group_runs_finds_runs():
    p_ids, _, _, _ = _batch(G=4, B=3)
    starts, counts = group_runs(_group_ids(len(p_ids), 4))
    assert starts.tolist() == [0, 4, 8] and counts.tolist() == [4, 4, 4]
    starts, counts = group_runs(torch.tensor([7, 7, 2, 2, 2, 7]))  # runs of consecutive equal ids
    assert starts.tolist() == [0, 2, 5] and counts.tolist() == [2, 3, 1]
    prompts = torch.tensor([[1, 2], [1, 2], [1, 3], [1, 3]])  # one group, two prompts: shared only where they agree
    starts, counts = group_runs(torch.zeros(4, dtype=torch.long), prompts)
    assert starts.tolist() == [0, 2] and counts.tolist() == [2, 2]


def test_a_group_with_different_prompts_gets_each_rows_own_logprobs(model):
    """A source may give one group's episodes different prompts (an outside agent writes its own): the shared-prefix
    forward must not run the first row's prompt for all of them."""
    p_ids, p_mask, c_ids, c_mask = _batch(G=3)
    groups = torch.zeros(len(p_ids), dtype=torch.long)  # every row one group, three different prompts
    a = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    b = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, group_ids=groups)
    m = c_mask.bool()
    torch.testing.assert_close(b.logp[m], a.logp[m], rtol=0, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prefix_same_logprobs_and_gradients(model, temperature):
    p_ids, p_mask, c_ids, c_mask = _batch()
    adv = torch.randn(len(c_ids))
    outs, grads = [], []
    for shared in (False, True):
        groups = _group_ids(len(p_ids), 3) if shared else None
        out = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, temperature=temperature, with_entropy=True, group_ids=groups)
        loss = -((out.logp * c_mask).sum(-1) * adv).sum() / c_mask.sum()
        outs.append(out)
        grads.append(_grads(model, loss))
    m = c_mask.bool()
    torch.testing.assert_close(outs[1].logp[m], outs[0].logp[m], rtol=0, atol=1e-5)
    torch.testing.assert_close(outs[1].entropy[m], outs[0].entropy[m], rtol=0, atol=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:  # the prompt's weights get gradient through the repeated KV cache
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=1e-4, atol=1e-6)


def test_shared_prefix_without_repeats_is_the_plain_path(model):
    p_ids, p_mask, c_ids, c_mask = _batch(G=1)
    a = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    b = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, group_ids=_group_ids(len(p_ids), 1))
    assert torch.equal(a.logp, b.logp)


# ---------------------------------------------------------------------------------------------
# through the Trainer's update: zero-advantage skip and shared prefix against the plain path

# conftest's make_trainer, with the batch these tests are written for: 3 prompts x 4 completions of up to 5 tokens
FP = ["steps=2", "rollout.prompts_per_step=3", "rollout.max_new_tokens=5", "doctor_every=0"]


def _update_grads(make_trainer, episodes, adv, *overrides):
    """Gradients handed to the optimizer (each pass), the metrics, and the trainer."""
    t = make_trainer(*FP, *overrides)
    grads, real_step = [], t.optimizer.step

    def step(*a, **k):
        grads.append({n: p.grad.clone() for n, p in t.model.named_parameters()})
        return real_step(*a, **k)

    t.optimizer.step = step
    result = t.updater(episodes, adv)
    return grads, result.metrics, t


def _close(ga, gb):
    assert len(ga) == len(gb)
    for a, b in zip(ga, gb):
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "extra",
    [[], ["algo.num_iterations=2"], ["optim.micro_batch_size=5"], ["algo.loss_type=grpo"], ["algo.importance_sampling_level=sequence"]],
)
def test_zero_advantage_skip_same_loss_and_gradients(make_trainer, extra):
    t = make_trainer(*FP)
    episodes = t.collector.collect(t.state).episodes
    adv = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.2, -0.4, 0.0, -0.8, 0.5, 0.5, -1.0, 0.0])  # a whole group and single rows at 0
    g_plain, m_plain, _ = _update_grads(make_trainer, episodes, adv, "optim.skip_zero_advantage=false", *extra)
    g_skip, m_skip, _ = _update_grads(make_trainer, episodes, adv, *extra)
    _close(g_plain, g_skip)
    assert m_skip["loss"] == pytest.approx(m_plain["loss"], abs=1e-6)
    for k in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "grad_norm"):
        assert m_skip[k] == pytest.approx(m_plain[k], abs=1e-6), k


def test_all_zero_advantages_still_step_the_optimizer(make_trainer):
    t = make_trainer(*FP)
    episodes = t.collector.collect(t.state).episodes
    adv = torch.zeros(12)
    g_plain, _, a = _update_grads(make_trainer, episodes, adv, "optim.skip_zero_advantage=false")
    g_skip, m, b = _update_grads(make_trainer, episodes, adv)
    _close(g_plain, g_skip)
    assert m["loss"] == 0.0


def test_skip_is_off_when_rows_are_needed():
    """The batch plan decides the zero-advantage skip once: on for the default objective, off
    with a KL term, with bnpo (normalised per micro-batch), with top-entropy selection (a
    whole-batch quantile), when disabled, and across ranks; update_rows then leaves out exactly
    the rows whose advantage is 0."""
    from rlvr.config import load_config
    from rlvr.training.batch_plan import BatchPlan
    from rlvr.training.fast_paths import update_rows

    def plan(*overrides, world_size=1):
        cfg = load_config(None, ["rollout.prompts_per_step=4", "rollout.group_size=4", *overrides])
        return BatchPlan.build(cfg, world_size, torch.nn.Linear(2, 2))

    def rows(p, adv):
        return update_rows(
            adv,
            torch.full((len(adv),), 3),
            torch.zeros(len(adv), dtype=torch.long),
            torch.ones(len(adv), 2, dtype=torch.long),
            p,
            skip_zero_advantage=p.skip_zero_advantage,
        )[0]

    adv = torch.tensor([0.0, 1.0, -1.0])
    assert plan().skip_zero_advantage
    assert rows(plan(), adv).tolist() == [1, 2]
    assert rows(plan(), torch.tensor([0.5, 1.0, -1.0])) is None  # no row to skip: all, as they are
    for extra in (["algo.beta=0.04"], ["algo.loss_type=bnpo"], ["algo.top_entropy_quantile=0.2"], ["optim.skip_zero_advantage=false"]):
        p = plan(*extra)
        assert not p.skip_zero_advantage, extra
        assert rows(p, adv) is None, extra
    assert not plan(world_size=2).skip_zero_advantage
    # the adaptive controller: rows skip only in steps whose applied coefficient is 0, with one optimizer step per batch
    adaptive = plan("algo.adaptive_entropy=true")
    assert not adaptive.skip_zero_advantage and adaptive.skip_while_no_bonus
    for extra in (["optim.steps_per_generation=2"], ["algo.num_iterations=2"], ["algo.beta=0.04"], ["optim.skip_zero_advantage=false"]):
        assert not plan("algo.adaptive_entropy=true", *extra).skip_while_no_bonus, extra
    assert not plan().skip_while_no_bonus


def test_compile_says_it_turns_the_shared_prefix_off():
    """optim.compile=on runs the plain path (each row with its prompt): the plan's warning names the setting and the
    tokens it costs, G (P + C) / (P + G C), and says nothing where compile is off, the prefix is off anyway, or it
    costs little (short prompts)."""
    from rlvr.config import load_config
    from rlvr.training.batch_plan import BatchPlan
    from rlvr.training.setup import plan_warnings

    def warnings(*overrides, prompt_tokens=259):
        cfg = load_config(None, ["rollout.prompts_per_step=4", "rollout.group_size=16", "rollout.max_new_tokens=48", *overrides])
        return plan_warnings(cfg, BatchPlan.build(cfg, 1, torch.nn.Linear(2, 2), prompt_tokens=prompt_tokens))

    (w,) = warnings("optim.compile=on")
    ratio = 16 * (259 + 48) / (259 + 16 * 48)
    assert "optim.compile=on turns the shared-prefix forward off" in w and "16 completions" in w and "~259-token prompt" in w
    assert f"about {ratio:.1f}x the tokens" in w and ratio == pytest.approx(4.78, abs=0.01)
    assert warnings() == warnings("optim.compile=off") == []
    assert warnings("optim.compile=on", "optim.shared_prefix=false") == []
    assert warnings("optim.compile=on", "rollout.group_size=1") == []
    assert warnings("optim.compile=on", prompt_tokens=4) == []  # 16 x 52 / (4 + 768) = 1.08x: not worth a warning


@pytest.mark.parametrize("extra", [[], ["optim.micro_batch_size=5"]])  # 5: groups split across micro-batches
def test_shared_prefix_update_same_as_plain(make_trainer, extra):
    t = make_trainer(*FP)
    episodes = t.collector.collect(t.state).episodes
    adv = torch.randn(12, generator=torch.Generator().manual_seed(3))
    g_plain, m_plain, _ = _update_grads(make_trainer, episodes, adv, "optim.shared_prefix=false", *extra)
    g_fast, m_fast, fast = _update_grads(make_trainer, episodes, adv, *extra)
    assert fast.plan.shared_prefix  # the fast run did take the shared-prefix forward
    _close(g_plain, g_fast)
    assert m_fast["loss"] == pytest.approx(m_plain["loss"], abs=1e-6)
    assert m_fast["entropy"] == pytest.approx(m_plain["entropy"], abs=1e-5)


def test_bf16_autocast_trains_fp32_weights_close_to_fp32(make_trainer):
    t = make_trainer(*FP, "model.autocast=bf16")
    e = t.collector.collect(t.state).episodes  # generation under autocast too
    with torch.no_grad():
        ref = completion_logprobs(t.model, e.prompt_ids, e.prompt_mask, e.completion_ids, e.attention_mask).logp
    out, C = t.updater.forward(t.model, e, slice(0, len(e)), with_entropy=False)
    m = e.attention_mask[:, :C].bool()
    assert out.logp.dtype == torch.float32
    torch.testing.assert_close(out.logp[m], ref[:, :C][m], rtol=0, atol=0.1)
    t.updater(e, torch.randn(12))
    assert all(p.dtype == torch.float32 for p in t.model.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in t.optimizer.state.values())


# ---------------------------------------------------------------------------------------------
# decode: the preallocated KV cache gives exactly what the concatenating DynamicCache gives


@pytest.mark.parametrize("ignore_eos", [True, False])  # False: finished rows leave the batch (buffers re-indexed)
def test_static_cache_decode_same_as_dynamic(tiny_model_dir, ignore_eos):
    from rlvr.data import render_prompt
    from rlvr.models.loading import load_model, load_tokenizer
    from rlvr.rollout import SamplingParams
    from rlvr.rollout.engines.hf import HFEngine

    torch.set_num_threads(1)
    tok, _ = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    prompts = [render_prompt(q, tok) for q in ["12+34=", "7-5=", "a longer prompt: 99+99="]]
    params = SamplingParams(n=16, temperature=1.0, max_new_tokens=24, ignore_eos=ignore_eos)
    a = HFEngine(model, tok, static_cache=False, drop_finished_fraction=0.0).generate(prompts, params, seeds=[1, 2, 3])
    b = HFEngine(model, tok, static_cache=True, shared_prefix=False, drop_finished_fraction=0.0, lean=False).generate(
        prompts, params, seeds=[1, 2, 3]
    )
    if not ignore_eos:
        assert (b.completion_mask.sum(-1) < 24).sum() >= 2  # rows did leave the batch mid-way
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    torch.testing.assert_close(b.sampling_logprobs, a.sampling_logprobs, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def gqa_model_dir(tmp_path_factory):
    """A char-tokenizer Llama with grouped-query attention (4 query heads share 2 KV heads)."""
    from rlvr.models.build import char_llama_config
    from rlvr.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    torch.manual_seed(7)
    cfg = char_llama_config(tok, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4)
    cfg.num_key_value_heads = 2
    path = tmp_path_factory.mktemp("gqa_model")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("ignore_eos, drop", [(True, 0.0), (False, 0.0), (False, 0.25)], ids=["fixed", "eos", "eos-drop-finished"])
@pytest.mark.parametrize("which", ["tiny", "gqa"])
def test_shared_prefix_decode_same_as_repeated_cache(tiny_model_dir, gqa_model_dir, which, ignore_eos, drop):
    """Each prompt's KV read once per group (shared_prefix) vs repeated G times: the same tokens
    and log-probs to 1e-5 in fp32, with left padding of three widths, finished rows leaving the
    batch, and grouped-query attention; and both agree with a full forward over the completions."""
    from rlvr.data import render_prompt
    from rlvr.models.loading import load_model, load_tokenizer
    from rlvr.rollout import SamplingParams
    from rlvr.rollout.engines.hf import HFEngine

    torch.set_num_threads(1)
    path = tiny_model_dir if which == "tiny" else gqa_model_dir
    tok, _ = load_tokenizer(path)
    model = load_model(path)
    prompts = [render_prompt(q, tok) for q in ["12+34=", "7-5=", "a much longer prompt than the others: 99+99="]]
    params = SamplingParams(n=16, temperature=1.0, max_new_tokens=20, ignore_eos=ignore_eos)
    a = HFEngine(model, tok, shared_prefix=False, drop_finished_fraction=drop, lean=False).generate(prompts, params, seeds=[4, 5, 6])
    b = HFEngine(model, tok, shared_prefix=True, drop_finished_fraction=drop, lean=False).generate(prompts, params, seeds=[4, 5, 6])
    assert (a.prompt_mask == 0).any()
    if not ignore_eos:
        assert (b.completion_mask.sum(-1) < 20).sum() >= 2  # rows did finish early
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    torch.testing.assert_close(b.sampling_logprobs, a.sampling_logprobs, rtol=0, atol=1e-5)
    with torch.no_grad():
        full = completion_logprobs(model, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask).logp
    m = b.completion_mask.bool()
    torch.testing.assert_close(b.sampling_logprobs[m], full[m], rtol=0, atol=1e-5)


def test_shared_prefix_decode_is_used_only_where_it_is_exact():
    from rlvr.rollout.engines.hf.shared_prefix import supports_shared_prefix

    def cfg(attn_implementation="sdpa"):
        return LlamaConfig(
            vocab_size=50,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            attn_implementation=attn_implementation,
        )

    assert supports_shared_prefix(cfg())
    assert not supports_shared_prefix(cfg("eager"))
    from transformers import Gemma2Config, MistralConfig, Qwen2Config

    assert not supports_shared_prefix(Gemma2Config(attn_implementation="sdpa"))  # soft-capping, sliding layers
    assert not supports_shared_prefix(MistralConfig(sliding_window=4096, attn_implementation="sdpa"))
    assert supports_shared_prefix(Qwen2Config(use_sliding_window=False, attn_implementation="sdpa"))


@pytest.mark.parametrize("extra", [[], ["optim.micro_batch_size=5"], ["algo.num_iterations=2", "optim.skip_zero_advantage=false"]])
def test_length_sorted_micro_batches_same_update(make_trainer, extra):
    from rlvr.training.fast_paths import length_sorted_order

    t = make_trainer(*FP, "rollout.max_new_tokens=12")
    e = t.collector.collect(t.state).episodes
    lengths = torch.tensor([12, 1, 2, 12, 3, 12, 1, 1, 12, 2, 4, 1])  # very uneven: sorting pays
    e.attention_mask = (torch.arange(12)[None] < lengths[:, None]).long()
    e.loss_mask = e.attention_mask.clone()  # single-turn: every token after the prompt is the model's
    e.completion_ids = e.completion_ids.masked_fill(e.attention_mask == 0, t.tokenizer.pad_token_id)
    assert length_sorted_order(lengths, torch.arange(12) // 4, prompt_len=8, micro_batch_size=12, pieces=4, shared_prefix=True) is not None
    adv = torch.tensor([0.5, -1.0, 0.0, 0.3, 1.1, -0.2, 0.7, -0.9, 0.0, 0.0, 0.0, 0.0])
    g_plain, m_plain, _ = _update_grads(make_trainer, e, adv, "rollout.max_new_tokens=12", "optim.pack_by_length=false", *extra)
    g_fast, m_fast, _ = _update_grads(make_trainer, e, adv, "rollout.max_new_tokens=12", *extra)
    _close(g_plain, g_fast)
    assert m_fast["loss"] == pytest.approx(m_plain["loss"], abs=1e-6)
    assert m_fast["clip_ratio/region_mean"] == pytest.approx(m_plain["clip_ratio/region_mean"], abs=1e-6)


def test_length_sorting_keeps_long_shared_prompts_together():
    from rlvr.training.fast_paths import length_sorted_order

    lengths = torch.tensor([12, 1, 2, 12, 3, 12, 1, 1, 12, 2, 4, 1])
    assert length_sorted_order(lengths, torch.arange(12) // 4, prompt_len=500, micro_batch_size=12, pieces=4, shared_prefix=True) is None
    assert (
        length_sorted_order(torch.full((12,), 7), torch.arange(12) // 4, prompt_len=8, micro_batch_size=12, pieces=4, shared_prefix=True)
        is None
    )
