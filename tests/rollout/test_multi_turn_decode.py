"""The multi-turn decode (rlvr.rollout.engines.hf.episode_decode) is exact: with external tokens in the middle
of episodes, left-padded prompts of different lengths, rows waiting different times and finishing
at different turns, the sampler's log-prob of every model token equals a fresh full forward over
the whole episode, and the external tokens are exactly the ones handed in."""

from __future__ import annotations

import copy
import random
import threading
import time

import pytest
import torch

from rlvr.models.forward import completion_logprobs
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.rollout import SamplingParams
from rlvr.rollout.engines.hf import episode_cache, episode_decode, kv_buffers, lean_decode
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.engines.hf.decode_attention import AttentionWay
from rlvr.rollout.engines.hf.shared_prefix import attend_prefix_and_own


class ScriptedDriver:
    """Ends a turn at a stop string; answers each of a row's first `turns` turns with its own
    external text after a random delay (from a thread), then ends the episode."""

    def __init__(self, tokenizer, stops, turns=2, delays=False):
        self.tokenizer, self.stop_strings, self.turns, self.delays = tokenizer, stops, turns, delays
        self.count, self.ready_rows, self.external = {}, {}, {}
        self.lock = threading.Condition()

    def end_turn(self, row, turn_ids, eos):
        n = self.count.get(row, 0)
        self.count[row] = n + 1
        if eos or n >= self.turns:
            return False
        ids = self.tokenizer(f"<r{row % 3}{'x' * (row % 4)}>", add_special_tokens=False)["input_ids"]
        self.external.setdefault(row, []).append(ids)

        def deliver():
            if self.delays:
                time.sleep(random.Random(row * 7 + n).random() * 0.05)
            with self.lock:
                self.ready_rows[row] = ids
                self.lock.notify_all()

        threading.Thread(target=deliver).start() if self.delays else deliver()
        return True

    def ready(self, block):
        with self.lock:
            if block:
                self.lock.wait_for(lambda: self.ready_rows, timeout=5)
            out, self.ready_rows = self.ready_rows, {}
        return out


@pytest.fixture(scope="module")
def tiny():
    tok, _ = load_tokenizer("tiny")
    return load_model("tiny"), tok


@pytest.mark.parametrize(
    "delays, in_place_share, grow",
    [(False, None, None), (True, None, None), (True, 0.0, 3), (True, 2.0, 3), (False, None, 0), (True, 0.0, 0)],
)
@pytest.mark.parametrize("layout", ["repeated", "shared", "repeated-native"])
def test_sampler_logprobs_equal_a_full_forward(tiny, delays, in_place_share, grow, layout, monkeypatch):
    """in_place_share: the share of rows from which a forward reads the cache in place (0: always,
    2: never; None: the default, where a run has forwards of each kind). grow: the slots the CPU buffers grow by
    (kv_buffers.GROW; 0: buffers of every slot read sliced; None: the default). layout: each row's buffers begin with
    its prompt (the short prompts' default; native: one-token forwards through the C kernel), or the prompt once per
    group, a second part merged (long prompts')."""
    model, tok = tiny
    repeated, native = layout.startswith("repeated"), layout.endswith("native")
    monkeypatch.setattr(episode_decode, "PROMPT_PER_ROW", repeated)  # the CPU's layout, or other devices'
    # the way asked for, not what this machine times (which may or may not take the C kernel)
    monkeypatch.setattr(episode_decode, "decode_attention_way", lambda *a, **k: AttentionWay(a[7], False, False, native and k["native"]))
    natives = []  # the C kernel's calls: the lean step's (native_step), the model's forward's (_native)
    native_call, native_step = episode_cache._native, lean_decode.native_step
    monkeypatch.setattr(episode_cache, "_native", lambda *a: natives.append(a[1].shape[0]) or native_call(*a))
    monkeypatch.setattr(lean_decode, "native_step", lambda *a: natives.append(a[1].shape[0]) or native_step(*a))
    if in_place_share is not None:
        monkeypatch.setattr(episode_cache, "READ_IN_PLACE_SHARE", in_place_share)
    sizes = []  # the buffers' slots after each forward's prepare
    if grow is not None:
        monkeypatch.setattr(kv_buffers, "GROW", grow)
    prepare = episode_cache.EpisodeState.prepare

    def prepare_recorded(state, *a, **k):
        prepare(state, *a, **k)
        layer = state.cache.layers[0]
        assert (layer.prefix_keys is None) == repeated and state.prompt_slots == (state.prefix_bias.shape[-1] if repeated else 0)
        sizes.append(layer.kbuf.shape[2] - state.prompt_slots)  # the slots for the rows' own tokens

    monkeypatch.setattr(episode_cache.EpisodeState, "prepare", prepare_recorded)
    step = grow if grow is not None else kv_buffers.GROW
    random.seed(0)
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in ("12+34=", "5-3=", "87+9=")
    ]  # different lengths: left padding
    G = 4
    driver = ScriptedDriver(tok, stops=["1", "5"], turns=2, delays=delays)
    engine = HFEngine(model, tok)
    chunks, feed = [], episode_decode._feed_chunks

    def feed_counted(model, lean, state, rows_tokens, *a, **k):
        chunks.append([len(t) for _, t in rows_tokens])
        return feed(model, lean, state, rows_tokens, *a, **k)

    monkeypatch.setattr(episode_decode, "_feed_chunks", feed_counted)
    ragged, feed_ragged = [], episode_decode._feed_ragged  # chunks side by side with sampled tokens, none padded

    def ragged_counted(lean, state, runs, *a, **k):
        chunks.append([len(t) for _, t in runs if isinstance(t, list)])
        ragged.append(len(runs) - len(chunks[-1]))  # the sampled tokens beside them
        return feed_ragged(lean, state, runs, *a, **k)

    monkeypatch.setattr(episode_decode, "_feed_ragged", ragged_counted)
    p_ids, p_mask, traces = engine.generate_episodes(prompts, SamplingParams(n=G, temperature=1.0, max_new_tokens=40), [11, 22, 33], driver)
    # every external token went in with its tool result's chunk (results are 4-7 tokens here; a result that fills
    # the budget ends its episode unfed), and (all delivered at once) forwards held chunks of different lengths
    # side by side, right-padded
    unfed = [len(t.loss) - 1 - max(i for i, x in enumerate(t.loss) if x) if t.truncated and not t.loss[-1] else 0 for t in traces]
    assert sum(map(sum, chunks)) == sum(t.loss.count(0) for t in traces) - sum(unfed) > 0
    assert delays or any(len(set(c)) > 1 for c in chunks)  # with delays, results arrive one by one
    assert len(traces) == len(prompts) * G
    assert bool(natives) == (native and step > 0)  # the kernel on whole buffers only (grown, masked), as the way says
    # where every forward reads each token's slots alone, a step's chunks go with its sampled tokens (each > 0; with
    # delays a result may reach no step that samples)
    assert all(ragged) and (not ragged or (native and step > 0)) and (delays or bool(ragged) == (native and step > 0)), ragged
    if native and step:  # every forward reads each token's slots alone (episode_cache.native_step): every slot at once
        assert set(sizes) == {40}
    elif step:  # grown by whole steps, as the rows' tokens (and tool results' chunks) came
        assert sizes == sorted(sizes) and sizes[0] == step and all(s % step == 0 or s == 40 for s in sizes)
        assert grow != 3 or len(set(sizes)) > 2  # by 3 slots: grown more than once
    else:  # every slot of the budget (40 new tokens) from the start
        assert set(sizes) == {40}
    # rows take external text and finish at different turns and lengths
    assert len({sum(1 for x in t.loss if x == 0) for t in traces}) > 1
    assert len({len(t.ids) for t in traces}) > 1
    for r, t in enumerate(traces):  # the external tokens fed are exactly the ones handed in, in order
        fed_external = [i for i, m in zip(t.ids, t.loss) if m == 0]
        assert fed_external == [x for ids in driver.external.get(r, [])[: len(fed_external)] for x in ids][: len(fed_external)]
    N, C = len(traces), max(len(t.ids) for t in traces)
    ids = torch.full((N, C), tok.pad_token_id)
    attn = torch.zeros(N, C, dtype=torch.long)
    loss = torch.zeros(N, C, dtype=torch.long)
    logp = torch.zeros(N, C)
    for r, t in enumerate(traces):
        ids[r, : len(t.ids)], attn[r, : len(t.ids)] = torch.tensor(t.ids), 1
        loss[r, : len(t.ids)], logp[r, : len(t.ids)] = torch.tensor(t.loss), torch.tensor(t.logps)
    P, M = p_ids.repeat_interleave(G, 0), p_mask.repeat_interleave(G, 0)
    m = loss.bool()
    assert m.sum() > 20 and (~m & attn.bool()).sum() > 5
    # Against the exact forward (float64 weights): the fp32 sampler is within 2e-5 (measured 0.9-1.4e-5
    # on the bundled model, whose logits reach ~20: fp32 rounding, as the fp32 training forward's 2.3e-5).
    exact = completion_logprobs(copy.deepcopy(model).double(), P, M, ids, attn, temperature=1.0).logp.detach()
    torch.testing.assert_close(logp[m].double(), exact[m], rtol=0, atol=2e-5)
    # The fp32 training forward carries its own rounding (~2e-5 from the exact one here, whatever
    # rows share its batch); the sampler agrees with it within that.
    full = completion_logprobs(model, P, M, ids, attn, temperature=1.0).logp.detach()
    torch.testing.assert_close(full[m], logp[m], rtol=0, atol=5e-5)


@pytest.mark.parametrize("rows", ["all", "some"])
@pytest.mark.parametrize("P", [5, 20], ids=["short-prompt", "prompt"])
@pytest.mark.parametrize("K", [1, 3])
def test_attention_over_prompt_and_own_tokens_is_one_softmax_over_both(rows, P, K):
    """attend_prefix_and_own (the prompt part and the own part, merged by their log-sum-exps) equals, for each row and
    query, one softmax over its prompt's real keys and the own slots its mask leaves (float64 to 1e-12): with every row
    and with some, grouped-query heads, a left-padded prompt, prompts shorter than the softmax's padding
    (decode_attention._softmax) and longer."""
    torch.manual_seed(1)
    B, G, Hkv, rep, D, t = 2, 3, 2, 2, 4, 9
    f64 = torch.float64
    prefix_k, prefix_v = torch.randn(B, Hkv, P, D, dtype=f64), torch.randn(B, Hkv, P, D, dtype=f64)
    prefix_bias = torch.zeros(B, 1, 1, P, dtype=f64)
    prefix_bias[1, ..., :2] = torch.finfo(f64).min  # the second prompt is left-padded (as padding_bias masks it)
    idx = torch.arange(B * G) if rows == "all" else torch.tensor([0, 2, 5])
    n = len(idx)
    keys, values = torch.randn(n, Hkv, t, D, dtype=f64), torch.randn(n, Hkv, t, D, dtype=f64)
    sees = torch.tensor([1, 3, 2, 4, 0, 5])[:n, None] + torch.arange(K)  # [n, K] the last own slot each query sees
    own_bias = torch.zeros(n, 1, K, t, dtype=f64).masked_fill((torch.arange(t) > sees[:, :, None])[:, None], torch.finfo(f64).min)
    query = torch.randn(n, Hkv * rep, K, D, dtype=f64)
    out = attend_prefix_and_own(query, keys, values, prefix_k, prefix_v, rows=idx, group_size=G, prefix_bias=prefix_bias,
                                scaling=0.5, own_bias=own_bias)  # fmt: skip
    assert out.shape == (n, K, Hkv * rep, D)
    for i, row in enumerate(idx.tolist()):
        real = prefix_bias[row // G, 0, 0] == 0
        for j in range(K):
            for h in range(Hkv * rep):
                kv = h // rep
                ks = torch.cat([prefix_k[row // G, kv][real], keys[i, kv, : sees[i, j] + 1]])
                vs = torch.cat([prefix_v[row // G, kv][real], values[i, kv, : sees[i, j] + 1]])
                truth = torch.softmax(ks @ query[i, h, j] * 0.5, -1) @ vs
                torch.testing.assert_close(out[i, j, h], truth, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rows", ["all", "some"])
def test_attention_of_a_chunk_equals_its_tokens_one_by_one(rows):
    """attend_prefix_and_own with K queries per row (a tool result fed at once), each masked to its own slots and
    the chunk's tokens before it, equals K one-token calls: grouped-query heads, left-padded prompts."""
    torch.manual_seed(0)
    B, G, Hkv, rep, D, P, K, t = 2, 3, 2, 2, 4, 5, 3, 7
    prefix_k, prefix_v = torch.randn(B, Hkv, P, D, dtype=torch.float64), torch.randn(B, Hkv, P, D, dtype=torch.float64)
    prefix_bias = torch.zeros(B, 1, 1, P, dtype=torch.float64)
    prefix_bias[1, ..., :2] = float("-inf")  # the second prompt is left-padded
    idx = torch.arange(B * G) if rows == "all" else torch.tensor([1, 3, 4])
    n = len(idx)
    keys, values = torch.randn(n, Hkv, t, D, dtype=torch.float64), torch.randn(n, Hkv, t, D, dtype=torch.float64)
    written = torch.tensor([1, 3, 2, 4, 0, 2])[:n]  # each row's tokens before the chunk; the chunk goes at written + j
    query = torch.randn(n, Hkv * rep, K, D, dtype=torch.float64)
    sees = written[:, None] + torch.arange(K)  # [n, K]
    own_bias = torch.zeros(n, 1, K, t, dtype=torch.float64).masked_fill((torch.arange(t) > sees[:, :, None])[:, None], float("-inf"))
    kw = dict(rows=idx, group_size=G, prefix_bias=prefix_bias, scaling=0.5)
    chunk = attend_prefix_and_own(query, keys, values, prefix_k, prefix_v, own_bias=own_bias, **kw)  # [n, K, Hq, D]
    for j in range(K):
        one = attend_prefix_and_own(query[:, :, j : j + 1], keys, values, prefix_k, prefix_v, own_bias=own_bias[:, :, j : j + 1], **kw)
        torch.testing.assert_close(chunk[:, j : j + 1], one, rtol=1e-12, atol=1e-12)


def test_same_seeds_same_episodes_whatever_the_tool_timing(tiny):
    model, tok = tiny
    prompts = [tok.apply_chat_template([{"role": "user", "content": "23+45="}], add_generation_prompt=True, tokenize=False)]
    params = SamplingParams(n=6, temperature=1.0, max_new_tokens=30)
    runs = []
    for delays in (False, True):
        _, _, traces = HFEngine(model, tok).generate_episodes(prompts, params, [5], ScriptedDriver(tok, ["1", "5"], delays=delays))
        runs.append([t.ids for t in traces])
    assert runs[0] == runs[1]


def test_each_rows_random_numbers_are_its_own_generators_drawn_one_per_sample(tiny, monkeypatch):
    """The rows' random numbers are drawn up front (episode_decode._row_uniforms): row r's k-th sample takes the k-th
    number its own generator (row_seed) gives one draw at a time, whichever rows sample beside it and whenever."""
    from rlvr.rollout.engines.sampling import row_seed

    seeds, G, T = [5, 9], 3, 12
    table = episode_decode._row_uniforms(seeds, G, T, torch.device("cpu"))  # [B x G, T]
    for r in range(len(seeds) * G):
        gen = torch.Generator().manual_seed(row_seed(seeds[r // G], r % G))
        assert torch.equal(table[r], torch.cat([torch.rand(1, generator=gen) for _ in range(T)]))
    model, tok = tiny
    prompts = [tok.apply_chat_template([{"role": "user", "content": "23+45="}], add_generation_prompt=True, tokenize=False)]
    taken: dict[int, list[int]] = {}  # row -> the table column each of its samples took
    sample = episode_decode._sample

    def recorded(logits, rows, params, uniforms, draws, seen):
        for r in rows:
            taken.setdefault(r, []).append(int(draws[r]))
        return sample(logits, rows, params, uniforms, draws, seen)

    monkeypatch.setattr(episode_decode, "_sample", recorded)
    params = SamplingParams(n=6, temperature=1.0, max_new_tokens=30)
    _, _, traces = HFEngine(model, tok).generate_episodes(prompts, params, [5], ScriptedDriver(tok, ["1", "5"], delays=True))
    for r, trace in enumerate(traces):
        assert taken[r] == list(range(sum(trace.loss)))  # one number per sampled token, in order


def test_prompt_copies_beyond_the_memory_share_take_the_shared_layout(tiny, monkeypatch):
    """The CPU's repeated layout copies the prompt into each row; where those copies would take more than
    REPEATED_PROMPT_MEMORY_SHARE of the machine's memory the prompt stays once per group, the episodes the same."""
    model, tok = tiny
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False) for q in ("23+45=", "7-2=")
    ]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24)
    repeated: list[bool] = []
    prepare = episode_cache.EpisodeState.prepare

    def prepare_recorded(state, *a, **k):
        prepare(state, *a, **k)
        repeated.append(state.cache.layers[0].prefix_keys is None)

    monkeypatch.setattr(episode_cache.EpisodeState, "prepare", prepare_recorded)
    runs = {}
    for memory in (2**40, 2**10):  # a terabyte: the copies fit; a kilobyte: they do not
        monkeypatch.setattr(episode_decode, "machine_memory_bytes", lambda memory=memory: memory)
        repeated.clear()
        _, _, traces = HFEngine(model, tok).generate_episodes(prompts, params, [5, 6], ScriptedDriver(tok, ["1", "5"]))
        runs[memory] = ([t.ids for t in traces], set(repeated))
    assert runs[2**40][1] == {True} and runs[2**10][1] == {False}
    assert runs[2**40][0] == runs[2**10][0]


def test_chunk_forwards_read_in_place_from_a_share_that_grows_with_their_length(monkeypatch):
    """A left-out row computes all K of a chunk's queries, a copied-out row's buffer costs the same whatever K: one
    token reads in place from a quarter of the rows, a 24-token chunk from 24/27 of them; 0 (always) and 2 (never)
    as set."""
    assert episode_cache.read_in_place_share(1) == 0.25
    assert episode_cache.read_in_place_share(24) == pytest.approx(24 / 27)
    assert episode_cache.read_in_place_share(3) == pytest.approx(0.5)
    for fixed in (0.0, 2.0):
        monkeypatch.setattr(episode_cache, "READ_IN_PLACE_SHARE", fixed)
        assert episode_cache.read_in_place_share(24) == fixed
    monkeypatch.setattr(episode_cache, "READ_IN_PLACE_SHARE", 0.25)
    monkeypatch.setattr(episode_cache, "CHUNKS_BY_LENGTH", False)
    assert episode_cache.read_in_place_share(24) == 0.25
