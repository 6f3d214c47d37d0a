"""Multi-turn episodes under bf16 autocast with fp32 KV buffers against bf16 ones (the scores, softmax and merge in
fp32 either way), whole batches of episodes in one process; the engine itself takes whichever this machine timed
faster for the single-turn decode's shared layout at the episode's shapes (episode_decode._attention_way):

    python bench/episodes_kv_dtype_ab.py /tmp/rlvr_bench/llama25m 96 45   # a model folder, new tokens, prompt repeats

The batch: bench/episodes_chunks_ab.py's 8 questions, each repeated `prompt repeats` times (45: ~270-token prompts,
config C's), x 8 episodes, temperature 1, ignore_eos, tool-result-like answers at "5" or "9". The ways alternate,
7 batches each (the first one's time left out of the medians and minimums).
"""

from __future__ import annotations

import sys

import torch

from _episodes import QUESTIONS, Answering, alternate, report
from _report import cpu_name
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.models.precision import autocast_context
from rlvr.rollout import SamplingParams
from rlvr.rollout.engines.hf import HFEngine, episode_decode
from rlvr.rollout.engines.hf.decode_attention import AttentionWay


def main() -> None:
    path, new_tokens, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(2)
    tok, _ = load_tokenizer(path)
    model = load_model(path).eval()
    messages = [[{"role": "user", "content": q * repeats}] for q in QUESTIONS]
    prompts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    timed = episode_decode.decode_attention_way(  # what the engine would take here
        len(prompts), 8, model.config.num_attention_heads, model.config.num_key_value_heads, model.config.head_dim,
        max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts), new_tokens, torch.float32,
        shared=True, lower=torch.bfloat16, layers=model.config.num_hidden_layers,
    )  # fmt: skip

    def run():
        with autocast_context("bf16", torch.device("cpu"), model):
            return HFEngine(model, tok).generate_episodes(prompts, params, list(range(len(prompts))), Answering(tok))[2]

    def buffers(dtype):  # the way the engine asks for, fixed
        return lambda: setattr(episode_decode, "decode_attention_way", lambda *a, **k: AttentionWay(getattr(torch, dtype), False, True))

    seconds, traces = alternate({f"{d} buffers": buffers(d) for d in ("float32", "bfloat16")}, run)
    print(f"{cpu_name()}, torch {torch.__version__}, 2 threads, bf16; {path}, {len(prompts)} x 8 episodes, {new_tokens} new tokens")
    print(f"prompt tokens {max(len(tok(p)['input_ids']) for p in prompts)}; this machine's timing takes {timed.dtype} buffers here")
    report(seconds)
    same = sum(a.ids == b.ids for a, b in zip(*traces.values()))
    print(f"the same tokens in {same} of {len(traces['float32 buffers'])} episodes")


if __name__ == "__main__":
    main()
