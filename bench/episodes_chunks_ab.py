"""Tool results (chunks of external tokens) in multi-turn episodes through the lean step (lean_decode.step_episode:
logits of each row's last token only) against through the model's own forward (every token's logits), the one-token
steps lean in both, whole batches of episodes in one process:

    python bench/episodes_chunks_ab.py src/rlvr/models/tiny-tools 240 fp32   # a model folder, new tokens, fp32|bf16
    python bench/episodes_chunks_ab.py MODEL 96 bf16 1,c   # and the turns' stop strings (default 5,9)

The batch: 8 prompts x 8 episodes, temperature 1. A turn ends at a "5" or a "9" (or the stop strings given) and is
answered, up to five times per episode, with a tool-result-like text of 20-30 tokens (bench/floor.py's config H
answers with about 24), so rows reach lengths of their own and take chunks of different lengths. Episodes run their
whole budget (ignore_eos). The ways alternate, 7 batches each (the first one's time left out of the medians); both
must give the same tokens.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from _report import cpu_name  # noqa: E402

from rlvr.models.loading import load_model, load_tokenizer  # noqa: E402
from rlvr.models.precision import autocast_context  # noqa: E402
from rlvr.rollout import SamplingParams  # noqa: E402
from rlvr.rollout.engines.hf import HFEngine, episode_decode  # noqa: E402

QUESTIONS = ("12+34=", "5-3=", "87+9=", "1+1=", "99-98=", "7*6=", "3+3=", "10-1=")


class Answering:
    """A turn driver: a turn ends at a stop string and is answered with a tool-result-like text, `turns` times."""

    def __init__(self, tokenizer, turns: int = 5, stop_strings: tuple[str, ...] = ("5", "9")):
        self.tokenizer, self.turns, self.count, self.pending = tokenizer, turns, {}, {}
        self.stop_strings = list(stop_strings)

    def end_turn(self, row, turn_ids, eos):
        n = self.count[row] = self.count.get(row, 0) + 1
        if eos or n > self.turns:
            return False
        text = f"<result>{row * 7 % 100} is too {'low' if row % 2 else 'high'}{'!' * (row % 5)}</result>"
        self.pending[row] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return True

    def ready(self, block):
        out, self.pending = self.pending, {}
        return out


def main() -> None:
    path, new_tokens, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    stops = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else ("5", "9")
    torch.set_num_threads(2)
    tok, _ = load_tokenizer(path)
    model = load_model(path).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False) for q in QUESTIONS]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)  # episodes of the whole budget
    feed = episode_decode._feed_chunks
    seconds: dict[str, list[float]] = {"model": [], "lean": []}
    traces, chunk_tokens = {}, []

    def model_chunks(model, lean, state, chunks, *a, **k):  # the model's forward, as before the lean chunks
        return feed(model, None, state, chunks, *a, **k)

    def lean_chunks(model, lean, state, chunks, *a, **k):
        chunk_tokens.append(sum(len(t) for _, t in chunks))
        return feed(model, lean, state, chunks, *a, **k)

    for i in range(7):
        for way in ["model", "lean"] if i % 2 == 0 else ["lean", "model"]:
            episode_decode._feed_chunks = model_chunks if way == "model" else lean_chunks  # type: ignore[assignment]
            chunk_tokens.clear()
            with autocast_context("none" if precision == "fp32" else precision, torch.device("cpu"), model):
                t = time.perf_counter()
                driver = Answering(tok, stop_strings=stops)
                traces[way] = HFEngine(model, tok).generate_episodes(prompts, params, list(range(len(prompts))), driver)[2]
                seconds[way].append(time.perf_counter() - t)
            if way == "lean":
                chunks = (len(chunk_tokens), sum(chunk_tokens))
    print(f"{cpu_name()}, torch {torch.__version__}, 2 threads, {precision}; {path}, {len(prompts)} x 8 episodes, {new_tokens} new tokens")
    for way, ts in seconds.items():
        print(f"{way}: median {statistics.median(ts[1:]):.3f} s, min {min(ts[1:]):.3f} s, {[round(t, 3) for t in ts]}")
    same = sum(a.ids == b.ids for a, b in zip(traces["model"], traces["lean"]))
    mean = statistics.mean(len(t.ids) for t in traces["lean"])
    print(f"the same tokens in {same} of {len(traces['lean'])} episodes; mean length {mean:.1f}; ", end="")
    print(f"{chunks[0]} chunk forwards, {chunks[1]} external tokens")


if __name__ == "__main__":
    main()
