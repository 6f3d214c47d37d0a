"""Episodes are the one seam between rollouts and training: a rollout source that is not the
single-turn one (here a test-only stub returning hand-made episodes whose loss mask has holes in
the middle, as tool results would leave) trains through the unchanged trainer, and the tokens
outside the loss mask get exactly zero gradient while staying in context."""

from __future__ import annotations

import math
import textwrap

import torch

from rlvr import algo
from rlvr.rollout import Episodes

G = 4
# model tokens (1) and external tokens (0) after the prompt; rows end at different places
PATTERNS = [
    [1, 1, 0, 0, 0, 1, 1],
    [1, 0, 1, 1, 0, 0, 1, 1, 1],
    [1, 1, 1, 1],
    [1, 0, 0, 1],
]

CHECKSUM = """
def checksum(prompts, completions, **kw):
    return [(sum(map(ord, c)) % 7) / 7 for c in completions]
"""


class StubSource:
    """A RolloutSource that makes episodes by hand: random tokens, holes in the loss mask."""

    group_size = G

    def __init__(self, tokenizer, vocab: int):
        self.tokenizer, self.vocab, self.calls = tokenizer, vocab, 0

    def rollout(self, rows: list[dict], seeds: list[int]) -> Episodes:
        self.calls += 1
        pad = self.tokenizer.pad_token_id
        texts = [self.tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
        prompts = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        N, P, C = len(rows) * G, max(map(len, prompts)), max(map(len, PATTERNS))
        prompt_ids = torch.full((N, P), pad)
        prompt_mask = torch.zeros(N, P, dtype=torch.long)
        ids = torch.full((N, C), pad)
        attention = torch.zeros(N, C, dtype=torch.long)
        loss = torch.zeros(N, C, dtype=torch.long)
        for i, seed in enumerate(seeds):
            gen = torch.Generator().manual_seed(seed)
            for j in range(G):
                n, pattern = i * G + j, PATTERNS[j % len(PATTERNS)]
                prompt_ids[n, P - len(prompts[i]) :], prompt_mask[n, P - len(prompts[i]) :] = torch.tensor(prompts[i]), 1
                ids[n, : len(pattern)] = torch.randint(3, self.vocab, (len(pattern),), generator=gen)
                attention[n, : len(pattern)] = 1
                loss[n, : len(pattern)] = torch.tensor(pattern)
        texts = self.tokenizer.batch_decode(ids.masked_fill(attention == 0, pad), skip_special_tokens=True)
        return Episodes(
            prompt_ids,
            prompt_mask,
            ids,
            attention,
            loss,
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
        return {"stub/rows": float(len(episodes))}


def _trainer(make_trainer, tmp_path, *overrides):
    reward = tmp_path / "checksum.py"
    reward.write_text(textwrap.dedent(CHECKSUM))
    probe = make_trainer(f"rewards.0.fn={reward}:checksum", run="probe")
    source = StubSource(probe.tokenizer, probe.model.config.vocab_size)
    return make_trainer(f"rewards.0.fn={reward}:checksum", f"rollout.group_size={G}", *overrides, source=source), source


def test_tokens_outside_the_loss_mask_get_exactly_zero_gradient(make_trainer, tmp_path, monkeypatch):
    seen = []
    real = algo.policy_loss

    def spy(logp, old_logp, advantages, mask, norms, **kw):
        logp.retain_grad()
        seen.append((logp, mask.clone(), norms))
        return real(logp, old_logp, advantages, mask, norms, **kw)

    monkeypatch.setattr(algo, "policy_loss", spy)
    for overrides in ([], ["optim.micro_batch_size=4", "algo.num_iterations=2", "algo.beta=0.04"]):
        seen.clear()
        t, _ = _trainer(make_trainer, tmp_path, *overrides, "optim.skip_zero_advantage=false", "optim.max_grad_norm=0")
        batch = t.collector.collect(t.state)
        e = batch.episodes
        adv = algo.combine_rewards(batch.rewards, t.rewards.weights, G)
        assert adv.abs().max() > 0
        result = t.updater(e, adv)
        holes = (e.attention_mask == 1) & (e.loss_mask == 0)
        assert holes.any() and not result.skipped
        for logp, mask, norms in seen:
            # the loss counts model tokens only
            assert norms.num_tokens == int(e.loss_mask.sum())
            grad = logp.grad
            assert torch.all(grad[mask == 0] == 0), "a token outside the loss mask got gradient"
            assert (grad[mask == 1] != 0).any()
        # the mask the loss saw is the episodes' loss mask, not their attention mask
        widths = [m.shape[1] for _, m, _ in seen[: len(result.micro_batch_sizes)]]
        masks = torch.cat([torch.nn.functional.pad(m, (0, max(widths) - m.shape[1])) for _, m, _ in seen[: len(result.micro_batch_sizes)]])
        assert int(masks.sum()) == int(e.loss_mask.sum())


def test_external_tokens_stay_in_context(make_trainer, tmp_path):
    """A model token's log-prob depends on the external tokens before it: they are attended to."""
    t, source = _trainer(make_trainer, tmp_path)
    e = t.collector.collect(t.state).episodes
    mb = slice(0, len(e))
    base = t.updater.forward(t.model, e.to(t.device), mb, with_entropy=False)[0].logp
    changed = e.completion_ids.clone()
    row, col = 0, 2  # an external token in the middle of row 0 (pattern 1 1 0 0 0 1 1)
    assert e.loss_mask[row, col] == 0 and e.loss_mask[row, 5] == 1
    changed[row, col] = (changed[row, col] + 1) % t.model.config.vocab_size
    other = Episodes(
        e.prompt_ids,
        e.prompt_mask,
        changed,
        e.attention_mask,
        e.loss_mask,
        e.sampling_logprobs,
        e.truncated,
        e.group_ids,
        e.group_size,
        e.completions,
        e.texts,
    )
    after = t.updater.forward(t.model, other.to(t.device), mb, with_entropy=False)[0].logp
    assert not torch.equal(base[row, 5], after[row, 5])  # a later model token sees it
    torch.testing.assert_close(base[row, :2], after[row, :2], rtol=0, atol=0)  # earlier tokens do not


def test_a_stub_source_trains_through_the_unchanged_trainer(make_trainer, tmp_path):
    t, source = _trainer(make_trainer, tmp_path, "steps=3")
    before = [p.detach().clone() for p in t.model.parameters()]
    summary = t.train()
    assert source.calls == 3 and t.state.step == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, t.model.parameters()))
    import json

    rows = [json.loads(line) for line in (t.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(math.isfinite(r["loss"]) for r in rows)
    assert rows[0]["stub/rows"] == 4 * G  # the source's own metrics reach the log
    # lengths count the model's own tokens (as TRL does with tools)
    assert rows[0]["completions/max_length"] == max(map(sum, PATTERNS))
    assert "output_dir" in summary
