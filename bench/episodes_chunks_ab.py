"""Tool results (chunks of external tokens) in multi-turn episodes through the lean step (lean_decode.step_episode:
logits of each row's last token only) against through the model's own forward (every token's logits), the one-token
steps lean in both, whole batches of episodes in one process, timed whole and inside the chunk forwards alone (on a
noisy machine the second, a share of each batch, shows the change more steadily):

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

import torch

from _episodes import QUESTIONS, Answering, alternate, report
from _report import cpu_name
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.models.precision import autocast_context
from rlvr.rollout import SamplingParams
from rlvr.rollout.engines.hf import HFEngine, episode_decode


def main() -> None:
    path, new_tokens, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    stops = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else ("5", "9")
    torch.set_num_threads(2)
    tok, _ = load_tokenizer(path)
    model = load_model(path).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False) for q in QUESTIONS]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)  # episodes of the whole budget
    feed, chunk_tokens = episode_decode._feed_chunks, []
    in_chunks: dict[str, list[float]] = {"model": [], "lean": []}  # per batch, the seconds inside the chunk forwards

    def chunks_through(way: str):
        def timed(model, lean, state, chunks, *a, **k):  # the model's forward (lean=None), as before the lean chunks
            if way == "lean":
                chunk_tokens.append(sum(len(t) for _, t in chunks))
            t = time.perf_counter()
            feed(model, lean if way == "lean" else None, state, chunks, *a, **k)
            in_chunks[way][-1] += time.perf_counter() - t

        def on():
            episode_decode._feed_chunks = timed  # type: ignore[assignment]
            in_chunks[way].append(0.0)
            if way == "lean":  # the counts: the last lean batch's
                chunk_tokens.clear()

        return on

    def run():
        with autocast_context("none" if precision == "fp32" else precision, torch.device("cpu"), model):
            driver = Answering(tok, stop_strings=stops)
            return HFEngine(model, tok).generate_episodes(prompts, params, list(range(len(prompts))), driver)[2]

    seconds, traces = alternate({way: chunks_through(way) for way in ("model", "lean")}, run)
    print(f"{cpu_name()}, torch {torch.__version__}, 2 threads, {precision}; {path}, {len(prompts)} x 8 episodes, {new_tokens} new tokens")
    print("whole batches:")
    report(seconds)
    print("inside the chunk forwards, per batch:")
    report(in_chunks)
    same = sum(a.ids == b.ids for a, b in zip(traces["model"], traces["lean"]))
    mean = statistics.mean(len(t.ids) for t in traces["lean"])
    print(f"the same tokens in {same} of {len(traces['lean'])} episodes; mean length {mean:.1f}; ", end="")
    print(f"{len(chunk_tokens)} chunk forwards, {sum(chunk_tokens)} external tokens")


if __name__ == "__main__":
    main()
