"""The hf engine's continuous decoder (an outside agent's requests): the same samples as engine.generate for the
same seeds, requests joining and leaving a running decode, an agent's next call feeding only its new tokens, and
errors answered to the requests without stopping the decoder."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.models import resolve_model_path
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.engines.hf.continuous import ContinuousDecoder
from rlvr.rollout.engines.protocols import SamplingParams
from rlvr.rollout.engines.turns import eos_ids


@dataclass
class Req:
    prompt_ids: list[int]
    max_tokens: int
    seed: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    stops: tuple[str, ...] = ()
    episode: str = "e0"


@pytest.fixture(scope="module")
def model_tok():
    torch.set_num_threads(1)
    path = resolve_model_path("tiny-tools")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture
def decoder(model_tok):
    model, tok = model_tok
    d = ContinuousDecoder(model, tok, eos=eos_ids(model, tok))
    yield d
    d.close()


def _generated(model_tok, prompts, params: SamplingParams, seeds):
    """engine.generate's samples: per prompt, per choice, (ids, log-probs)."""
    model, tok = model_tok
    gen = HFEngine(model, tok).generate(prompts, params, seeds)
    out = []
    for i in range(len(prompts)):
        rows = range(i * params.n, (i + 1) * params.n)
        keep = [gen.completion_mask[r].bool() for r in rows]
        out.append([(gen.completion_ids[r][k].tolist(), gen.sampling_logprobs[r][k]) for r, k in zip(rows, keep)])
    return out


def _concurrently(decoder, reqs):
    out = [None] * len(reqs)

    def run(k):
        out[k] = decoder.submit(reqs[k])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize("n,temperature,top_p", [(1, 1.0, 1.0), (3, 1.0, 1.0), (2, 0.7, 0.9), (1, 0.0, 1.0)])
def test_the_same_samples_as_engine_generate_for_the_same_seeds(model_tok, decoder, n, temperature, top_p):
    _, tok = model_tok
    prompts = [tok(t)["input_ids"] for t in ("What is 12*34? ", "Compute 7+8, then 9*9", "Hi")]
    seeds = [101, 202, 303]
    params = SamplingParams(n, temperature, top_p, 0, 20, False)
    want = _generated(model_tok, prompts, params, seeds)
    got = _concurrently(decoder, [Req(p, 20, s, n, temperature, top_p, episode=f"e{i}") for i, (p, s) in enumerate(zip(prompts, seeds))])
    for w, g in zip(want, got):
        assert [s.ids for s in g] == [ids for ids, _ in w]
        for s, (ids, lp) in zip(g, w):
            torch.testing.assert_close(torch.tensor(s.logprobs), lp, rtol=0, atol=1e-5)
            assert s.finish == ("length" if len(ids) == 20 else "stop")


def test_grouped_query_attention_gives_the_engines_samples(model_tok):
    """Models whose keys/values have fewer heads than their queries (SmolLM2, Qwen, Llama 3): the same samples as
    engine.generate, and a continuing call as if its prompt were decoded fresh."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tok = model_tok
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, max_position_embeddings=256, pad_token_id=tok.pad_token_id)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    d = ContinuousDecoder(model, tok, eos=eos_ids(model, tok))
    try:
        prompts = [tok(t)["input_ids"] for t in ("What is 12*34? ", "Hi")]
        got = _concurrently(d, [Req(p, 16, 9 + i, episode=f"e{i}") for i, p in enumerate(prompts)])
        follow = prompts[0] + got[0][0].ids + tok(" more")["input_ids"]
        again = d.submit(Req(follow, 16, 3))[0]
    finally:
        d.close()
    want = _generated((model, tok), prompts + [follow], SamplingParams(1, 1.0, 1.0, 0, 16, False), [9, 10, 3])
    for g, w in zip([got[0][0], got[1][0], again], want):
        assert g.ids == w[0][0]
        torch.testing.assert_close(torch.tensor(g.logprobs), w[0][1], rtol=0, atol=1e-5)


def test_stop_strings_and_budgets_end_a_reply(model_tok, decoder):
    _, tok = model_tok
    prompt = tok("What is 123*45? Use the calculator.")["input_ids"]
    free = decoder.submit(Req(prompt, 40, 7))[0]
    text = tok.decode(free.ids)
    stop = text[len(text) // 2 : len(text) // 2 + 2]  # a stop string the free reply reaches midway
    cut = decoder.submit(Req(prompt, 40, 7, stops=(stop,)))[0]
    assert cut.finish == "stop" and stop in tok.decode(cut.ids) and stop not in tok.decode(cut.ids[:-1])
    assert cut.ids == free.ids[: len(cut.ids)]
    short = decoder.submit(Req(prompt, 3, 7))[0]
    assert short.finish == "length" and short.ids == free.ids[:3]


def test_a_continuing_call_feeds_only_its_new_tokens(model_tok, decoder):
    model, tok = model_tok
    prompt = tok("What is 12*34?")["input_ids"]
    first = decoder.submit(Req(prompt, 12, 5))[0]
    new = tok(" And 5+5?")["input_ids"]
    follow = prompt + first.ids + new  # the agent's next call: its history, the reply, a new message
    before, fed = decoder.forwards, decoder.tokens_fed
    second = decoder.submit(Req(follow, 12, 6))[0]
    # the reply's last token (never fed) and the new message, then each sampled token but the last: no history run again
    assert decoder.tokens_fed - fed == len(new) + len(second.ids) and decoder.forwards - before == len(second.ids)
    (want,) = _generated(model_tok, [follow], SamplingParams(1, 1.0, 1.0, 0, 12, False), [6])
    assert second.ids == want[0][0]
    torch.testing.assert_close(torch.tensor(second.logprobs), want[0][1], rtol=0, atol=1e-5)
    fed = decoder.tokens_fed
    other = decoder.submit(Req(follow, 12, 6, episode="e1"))[0]  # another episode never reads this one's row
    assert decoder.tokens_fed - fed == len(follow) + len(other.ids) - 1 and other.ids == second.ids


def test_a_request_joins_and_leaves_a_running_decode(model_tok, decoder):
    _, tok = model_tok
    prompt = tok("Tell me a long story")["input_ids"]
    result = []
    t = threading.Thread(target=lambda: result.extend(decoder.submit(Req(prompt, 120, 1))))  # seed 1: all 120 tokens
    t.start()
    while decoder.forwards < 5:  # the long request is decoding
        threading.Event().wait(0.001)
    short = decoder.submit(Req(tok("Hi")["input_ids"], 2, 2, episode="e1"))[0]
    long_still_running = t.is_alive()
    t.join()
    assert long_still_running and len(short.ids) <= 2  # it joined the running decode and left it before the long one ended
    (want,) = _generated(model_tok, [prompt], SamplingParams(1, 1.0, 1.0, 0, 120, False), [1])
    assert result[0].finish == "length" and result[0].ids == want[0][0]  # the long one is as if it had decoded alone


def test_an_error_is_answered_and_the_decoder_goes_on(model_tok, decoder):
    model, tok = model_tok
    with pytest.raises(IndexError):
        decoder.submit(Req([model.config.vocab_size + 5], 4, 1))  # an id outside the vocabulary
    assert len(decoder.submit(Req(tok("Hi")["input_ids"], 4, 1))[0].ids) >= 1


def test_the_model_is_as_it_was_after_close(model_tok):
    model, tok = model_tok
    impl, training = model.config._attn_implementation, model.training
    d = ContinuousDecoder(model, tok, eos=eos_ids(model, tok))
    d.submit(Req(tok("Hi")["input_ids"], 3, 1))
    d.close()
    assert model.config._attn_implementation == impl and model.training == training
    with pytest.raises(RuntimeError, match="closed"):
        d.submit(Req(tok("Hi")["input_ids"], 3, 1))


def test_a_decoder_whose_generation_mode_fails_raises_instead_of_hanging(model_tok, monkeypatch):
    """generation_mode starts on the decode thread; when it fails there, the constructor raises its error (it used
    to return a decoder whose thread was gone, and the first submit waited forever) and the model is left as it was."""
    import contextlib

    import rlvr.rollout.engines.hf.continuous as continuous

    model, tok = model_tok
    impl, training = model.config._attn_implementation, model.training

    @contextlib.contextmanager
    def failing_mode(*args, **kwargs):
        raise ValueError("no generation mode for this model")
        yield

    monkeypatch.setattr(continuous, "generation_mode", failing_mode)
    outcome: list[BaseException | ContinuousDecoder] = []

    def build():
        try:
            outcome.append(ContinuousDecoder(model, tok, eos=eos_ids(model, tok)))
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=build, daemon=True)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "the constructor hung"
    assert isinstance(outcome[0], ValueError) and "no generation mode" in str(outcome[0])
    assert model.config._attn_implementation == impl and model.training == training


def test_a_driven_decoder_decodes_on_the_driving_thread_with_the_same_samples(model_tok):
    """own_thread=False (the trainer's agents): the caller's thread runs the decode in drive(), until `until()` holds;
    the samples are the threaded decoder's; a request arriving after the last drive is answered at close."""
    model, tok = model_tok
    reqs = [Req(tok(t)["input_ids"], 12, s, 2, episode=f"e{s}") for s, t in ((7, "What is 12*34? "), (8, "Hi"))]
    threaded = ContinuousDecoder(model, tok, eos=eos_ids(model, tok))
    want = _concurrently(threaded, reqs)
    waits = iter([False, False, True])
    threaded.drive(lambda: next(waits))  # with a thread of its own, drive() only waits for `until`
    assert next(waits, "spent") == "spent"
    threaded.close()
    driven = ContinuousDecoder(model, tok, eos=eos_ids(model, tok), own_thread=False)
    forwards: list[int] = []
    hook = model.register_forward_pre_hook(lambda *_: forwards.append(threading.get_ident()))
    got: list = [None] * len(reqs)
    askers = [threading.Thread(target=lambda k=k: got.__setitem__(k, driven.submit(reqs[k]))) for k in range(len(reqs))]
    try:
        for t in askers:
            t.start()
        driven.drive(lambda: not any(t.is_alive() for t in askers))
    finally:
        hook.remove()
    assert not any(t.is_alive() for t in askers)
    assert forwards and set(forwards) == {threading.get_ident()}
    assert [[s.ids for s in g] for g in got] == [[s.ids for s in w] for w in want]
    # the requests reach the two decoders at different moments, so their rows can share a forward with different
    # neighbours: the products then round differently (3.3e-6 on an AMD EPYC), as between the decoder and
    # engine.generate above (1e-5); the tokens must be the same exactly
    assert [[s.logprobs for s in g] for g in got] == [[pytest.approx(s.logprobs, abs=1e-5) for s in w] for w in want]
    late: dict = {}
    asker = threading.Thread(target=lambda: late.setdefault("error", pytest.raises(RuntimeError, driven.submit, reqs[0])))
    asker.start()
    while not driven.queue:  # it waits: nobody drives
        asker.join(0.01)
    driven.close()
    asker.join(10)
    assert "closed before this request was answered" in str(late["error"].value)


def test_drive_returns_when_until_holds_even_while_requests_decode(model_tok):
    """An agent past its time keeps no rollout waiting: `until()` is checked before every step."""
    model, tok = model_tok
    driven = ContinuousDecoder(model, tok, eos=eos_ids(model, tok), own_thread=False)
    steps = []
    hook = model.register_forward_pre_hook(lambda *_: steps.append(1))
    out: dict = {}

    def ask():
        try:
            out["samples"] = driven.submit(Req(tok("What is 12*34? ")["input_ids"], 200, 1))
        except Exception as e:  # noqa: BLE001 - the test reads what the caller saw
            out["error"] = e

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        driven.drive(lambda: len(steps) >= 2 or not asker.is_alive())
    finally:
        hook.remove()
    assert len(steps) == 2 and asker.is_alive(), out  # stopped mid-reply: 2 tokens of the 200 asked
    driven.close()
    asker.join(10)
    assert "closed before this request was answered" in str(out.get("error"))
