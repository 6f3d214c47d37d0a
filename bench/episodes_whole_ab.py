"""The multi-turn episode cache's buffers read whole (grown GROW slots at a time, unwritten slots masked) against
buffers of every slot read sliced, whole batches of episodes in one process:

    python bench/episodes_whole_ab.py /tmp/rlvr_bench/llama25m 96   # a model folder, new tokens per episode

The batch: 8 arithmetic prompts x 8 episodes, temperature 1, bf16 autocast (the cache in fp32). A turn ends at a
"5" or a "9" and is answered, three times per episode, with a few external tokens of its own, so rows reach lengths
of their own and tool results go in as chunks. rlvr.rollout.engines.hf.kv_buffers.GROW = 0 is the sliced way;
the ways alternate, 7 batches each (the first one's time left out of the medians).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from _episodes import QUESTIONS, alternate, report  # noqa: E402
from _report import cpu_name  # noqa: E402

from rlvr.models.loading import load_model, load_tokenizer  # noqa: E402
from rlvr.models.precision import autocast_context  # noqa: E402
from rlvr.rollout import SamplingParams  # noqa: E402
from rlvr.rollout.engines.hf import HFEngine, kv_buffers  # noqa: E402


class Answering:
    """A turn driver: a turn ends at a stop string and is answered with the row's own text, `turns` times."""

    def __init__(self, tokenizer, turns: int = 3):
        self.tokenizer, self.turns, self.count, self.pending = tokenizer, turns, {}, {}
        self.stop_strings = ["5", "9"]

    def end_turn(self, row, turn_ids, eos):
        n = self.count[row] = self.count.get(row, 0) + 1
        if eos or n > self.turns:
            return False
        self.pending[row] = self.tokenizer(f"<r{row % 3}{'x' * (row % 4)}>", add_special_tokens=False)["input_ids"]
        return True

    def ready(self, block):
        out, self.pending = self.pending, {}
        return out


def main() -> None:
    path, new_tokens = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(2)
    tok, _ = load_tokenizer(path)
    model = load_model(path).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False) for q in QUESTIONS]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=new_tokens)
    grow = kv_buffers.GROW

    def run():
        with autocast_context("bf16", torch.device("cpu"), model):
            return HFEngine(model, tok).generate_episodes(prompts, params, list(range(len(prompts))), Answering(tok))[2]

    ways = {"sliced": lambda: setattr(kv_buffers, "GROW", 0), "whole": lambda: setattr(kv_buffers, "GROW", grow)}
    seconds, traces = alternate(ways, run)
    print(f"{cpu_name()}, torch {torch.__version__}, 2 threads; {path}, {len(prompts)} x 8 episodes, {new_tokens} new tokens")
    report(seconds)
    same = sum(a.ids == b.ids for a, b in zip(traces["sliced"], traces["whole"]))
    mean = statistics.mean(len(t.ids) for t in traces["whole"])
    print(f"the same tokens in {same} of {len(traces['whole'])} episodes; mean length {mean:.1f}")


if __name__ == "__main__":
    main()
