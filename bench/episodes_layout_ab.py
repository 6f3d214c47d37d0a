"""Multi-turn episodes with each row's KV buffers beginning with its prompt (the repeated layout: one softmax over
prompt + own tokens) against the prompt's keys/values once per group (the shared layout: a second part, merged by
log-sum-exps), whole batches of episodes in one process; the engine itself takes the repeated layout on the CPU
(episode_decode.PROMPT_PER_ROW), the shared one on other devices.

    python bench/episodes_layout_ab.py tiny-tools 240 4 bf16 --out bench/results/episodes_layout_amd.md   # config H's model and budget
    python bench/episodes_layout_ab.py /tmp/rlvr_bench/llama9m_gqa 96 45 bf16 --out bench/results/episodes_layout_amd.md  # appended

Arguments: a model (bundled name or folder), new tokens per episode, prompt repeats, precision (fp32 or bf16 autocast).
The batch: bench/episodes_chunks_ab.py's 8 questions, each repeated `prompt repeats` times, x 8 episodes, temperature
1, ignore_eos, tool-result-like answers at "5" or "9" (bench/_episodes.py). Both ways keep fp32 buffers. The ways
alternate, 7 batches each (the first one's time left out of the medians and minimums).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

import torch

from _episodes import QUESTIONS, Answering, alternate, report
from _report import cpu_name
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.models.precision import autocast_context
from rlvr.rollout import SamplingParams
from rlvr.rollout.engines.hf import HFEngine, episode_decode
from rlvr.rollout.engines.hf.decode_attention import AttentionWay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("new_tokens", type=int)
    ap.add_argument("repeats", type=int)
    ap.add_argument("precision", choices=["fp32", "bf16"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    tok, _ = load_tokenizer(args.model)
    model = load_model(args.model).eval()
    messages = [[{"role": "user", "content": q * args.repeats}] for q in QUESTIONS]
    prompts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=args.new_tokens, ignore_eos=True)

    def run():
        with autocast_context("bf16" if args.precision == "bf16" else "none", torch.device("cpu"), model):
            return HFEngine(model, tok).generate_episodes(prompts, params, list(range(len(prompts))), Answering(tok))[2]

    def layout(shared: bool):  # the way the engine asks for, fixed: fp32 buffers
        return lambda: setattr(episode_decode, "decode_attention_way", lambda *a, **k: AttentionWay(torch.float32, False, shared))

    seconds, traces = alternate({"shared": layout(True), "repeated": layout(False)}, run)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print(f"Command: `python bench/episodes_layout_ab.py {' '.join(sys.argv[1:])}`\n")
        print(f"{cpu_name()}, torch {torch.__version__}, 2 threads, {args.precision}; {args.model}, {len(prompts)} x 8 episodes,", end=" ")
        P = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
        print(f"{args.new_tokens} new tokens, prompts of {P} tokens\n")
        report(seconds)
        same = sum(a.ids == b.ids for a, b in zip(*traces.values()))
        print(f"\nthe same tokens in {same} of {len(traces['shared'])} episodes (the two layouts round the attention differently)")
    print(printed.getvalue(), end="")
    if args.out:  # one section per run, appended
        out = Path(args.out)
        head = "" if out.exists() else "# Multi-turn episodes: the prompt once per group (shared) vs at the head of each row (repeated)\n\n"
        with out.open("a") as f:
            f.write(f"{head}```\n{printed.getvalue()}```\n\n")


if __name__ == "__main__":
    main()
