"""The compiled training forward (optim.compile=on, rlvr.models.compiled): lengths padded to
buckets with masked tokens only; log-probs, entropies and gradients equal to the plain path's;
a run compiles once per length bucket it meets, and says so in its metrics and on the console.

torch.compile is slow (inductor writes and builds C++ kernels: tens of seconds per graph with a
cold cache, seconds with a warm one), so the models are tiny and only three graphs are built.
A missing C++ compiler fails these tests; it is not a reason to skip them."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest
import torch

from rlvr.models.compiled import CompileClock, CompiledForward, bucket_length, pad_to_buckets
from rlvr.models.forward import completion_logprobs
from rlvr.rollout import Episodes


def test_a_cpp_compiler_is_there():
    """torch.compile on CPU needs one; without it every other test here fails, and this names why."""
    assert shutil.which("g++") or shutil.which("c++"), "no C++ compiler (g++): torch.compile cannot build CPU kernels"


def test_buckets_pad_with_masked_tokens_only():
    for n in [*range(0, 300), 511, 512, 513, 1000, 4097]:
        b = bucket_length(n)
        assert b >= n and b - n <= max(15, n // 4) and bucket_length(b) == b
    assert [bucket_length(n) for n in (1, 16, 17, 128, 129, 200, 257)] == [16, 16, 32, 128, 160, 224, 320]

    g = torch.Generator().manual_seed(0)
    P, C = 11, 21
    prompt_len, completion_len = torch.tensor([11, 7, 3]), torch.tensor([21, 5, 1])
    prompt_mask = (torch.arange(P) >= P - prompt_len[:, None]).long()  # left-padded
    completion_mask = (torch.arange(C) < completion_len[:, None]).long()  # right-padded
    prompt_ids = torch.randint(3, 100, (3, P), generator=g) * prompt_mask
    completion_ids = torch.randint(3, 100, (3, C), generator=g) * completion_mask
    for rows in (slice(0, 3), slice(1, 2)):
        ids, attn, C2 = pad_to_buckets(prompt_ids[rows], prompt_mask[rows], completion_ids[rows], completion_mask[rows])
        P2 = ids.shape[1] - C2
        assert (P2, C2) == (16, 32)
        N = len(prompt_ids[rows])
        assert ids.shape[0] == max(N, 2)  # one row runs as two copies of it
        assert torch.equal(ids[1:], ids[:1].expand_as(ids[1:])) if N == 1 else True
        # every real token where it was, in order; everything added has mask 0
        assert torch.equal(ids[:N, P2 - P : P2], prompt_ids[rows]) and torch.equal(attn[:N, P2 - P : P2], prompt_mask[rows])
        assert torch.equal(ids[:N, P2 : P2 + C], completion_ids[rows]) and torch.equal(attn[:N, P2 : P2 + C], completion_mask[rows])
        assert attn[:, : P2 - P].sum() == 0 and attn[:, P2 + C :].sum() == 0
        assert attn[:N].sum() == prompt_mask[rows].sum() + completion_mask[rows].sum()


def _micro_batch(g, N, P, C, vocab):
    """A left-padded prompt and a right-padded completion, rows of different lengths (the longest full)."""
    prompt_len = torch.randint(1, P + 1, (N,), generator=g)
    completion_len = torch.randint(1, C + 1, (N,), generator=g)
    prompt_len[0], completion_len[0] = P, C
    prompt_mask = (torch.arange(P) >= P - prompt_len[:, None]).long()
    completion_mask = (torch.arange(C) < completion_len[:, None]).long()
    return (
        torch.randint(3, vocab, (N, P), generator=g) * prompt_mask,
        prompt_mask,
        torch.randint(3, vocab, (N, C), generator=g) * completion_mask,
        completion_mask,
    )


def test_compiled_forward_equals_the_plain_path_in_every_bucket(tiny_model_dir):
    """float64, in two completion buckets (16, 32) and for a single row. Traced by torch.compile but
    run by the plain kernels (backend `eager`), the padded forward is the plain path to 1e-12:
    log-probs, entropies, every gradient. Through inductor, to fp32 rounding: a Llama computes its
    RMSNorm and rotary embedding in fp32 in any dtype, and inductor's fp32 rsqrt and cos differ from
    ATen's in the last bit (measured: 4e-8 on log-probs, 4e-7 of the largest gradient). Two graphs
    each, none for a new length or row count in a bucket."""
    from transformers import AutoModelForCausalLM

    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]
    cpu = torch.device("cpu")
    paths = {
        "traced": (CompiledForward(cpu, backend="eager"), CompileClock(), 1e-12),
        "inductor": (CompiledForward(cpu), CompileClock(), 2e-6),
    }
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    # (rows, prompt width, completion width): buckets (16, 16), (16, 32), (16, 16), (16, 32), (16, 16)
    shapes = [(5, 9, 7), (3, 12, 21), (4, 5, 13), (6, 16, 32), (1, 8, 9)]
    graphs = {name: [] for name in paths}

    def run(fn, batch, weights):
        out = fn(model, *batch, temperature=0.7, with_entropy=True)
        return out.logp.detach(), out.entropy, torch.autograd.grad((out.logp * weights).sum(), params)

    for N, P, C in shapes:
        batch = _micro_batch(g, N, P, C, vocab)
        weights = torch.randn(N, C, generator=g, dtype=torch.float64) * batch[3]
        plain_logp, plain_entropy, plain_grads = run(completion_logprobs, batch, weights)
        for name, (compiled, clock, tol) in paths.items():
            with clock.measuring():
                logp, entropy, grads = run(compiled, batch, weights)
            graphs[name].append(clock.graphs)
            assert logp.shape == entropy.shape == (N, C)
            torch.testing.assert_close(logp, plain_logp, rtol=0, atol=tol)
            torch.testing.assert_close(entropy, plain_entropy, rtol=0, atol=tol)
            for a, b in zip(grads, plain_grads):
                torch.testing.assert_close(a, b, rtol=0, atol=tol * float(b.abs().max()))  # of the largest gradient
    assert graphs == {name: [1, 2, 2, 2, 2] for name in paths}
    assert paths["inductor"][1].seconds > 0


CHECKSUM = """
def checksum(prompts, completions, **kw):
    return [(sum(map(ord, c)) % 7) / 7 for c in completions]
"""
G = 4
LENGTHS = [5, 14, 20, 9, 30, 3]  # completion width of each step: buckets 16, 16, 32, 16, 32, 16


class FixedLengthSource:
    """Hand-made episodes: 8-token prompts (left-padded), every row of step k LENGTHS[k] tokens long."""

    group_size = G

    def __init__(self, tokenizer, vocab: int):
        self.tokenizer, self.vocab, self.calls = tokenizer, vocab, 0

    def rollout(self, rows: list[dict], seeds: list[int]) -> Episodes:
        C = LENGTHS[self.calls % len(LENGTHS)]
        self.calls += 1
        N, P = len(rows) * G, 8
        g = torch.Generator().manual_seed(seeds[0])
        prompt_mask = (torch.arange(P) >= torch.randint(0, 3, (len(rows),), generator=g).repeat_interleave(G)[:, None]).long()
        prompt_ids = torch.randint(3, self.vocab, (len(rows), P), generator=g).repeat_interleave(G, 0) * prompt_mask
        ids = torch.randint(3, self.vocab, (N, C), generator=g)
        ones = torch.ones(N, C, dtype=torch.long)
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return Episodes(
            prompt_ids,
            prompt_mask,
            ids,
            ones,
            ones,
            torch.zeros(N, C),
            torch.zeros(N, dtype=torch.bool),
            torch.arange(len(rows)).repeat_interleave(G),
            G,
            texts,
            texts,
        )

    def sync_weights(self) -> None:
        pass

    def metrics(self, episodes: Episodes) -> dict:
        return {}


def test_a_compiled_run_compiles_once_per_bucket_and_trains_as_the_plain_one(make_trainer, tmp_path, capsys):
    torch._dynamo.reset()
    reward = tmp_path / "checksum.py"
    reward.write_text(textwrap.dedent(CHECKSUM))
    runs = {}
    for setting in ("off", "on"):
        args = [f"rewards.0.fn={reward}:checksum", f"rollout.group_size={G}", f"steps={len(LENGTHS)}", f"optim.compile={setting}"]
        probe = make_trainer(*args, run=f"probe-{setting}")
        t = make_trainer(*args, run=setting, source=FixedLengthSource(probe.tokenizer, probe.model.config.vocab_size))
        assert t.plan.compiled_forward == (setting == "on") and t.plan.shared_prefix == (setting == "off")
        t.train()
        runs[setting] = [json.loads(line) for line in (t.output_dir / "metrics.jsonl").read_text().splitlines()]
    plain, compiled = runs["off"], runs["on"]
    assert "compile/count" not in plain[0] and "time/compile" not in plain[0]
    # two buckets (16 and 32 completion tokens after 8-token prompts): two graphs, built at steps 1 and 3
    assert [m["compile/count"] for m in compiled] == [1, 1, 2, 2, 2, 2]
    assert [m["time/compile"] > 0 for m in compiled] == [True, False, True, False, False, False]
    for a, b in zip(plain, compiled):
        for key in ("loss", "grad_norm", "entropy", "reward"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    console = capsys.readouterr().out
    assert console.count("[compile]") == 2 and "[compile] step 3:" in console and "(2 graphs so far)" in console
