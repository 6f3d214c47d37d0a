"""How far the lean decode's log-probs under bf16 autocast lie from a forward of the whole sequence (transformers' own,
under the same autocast, as a trainer scores the samples), for each way the decode's attention may run: fp32 KV
buffers or bf16 ones, through the batched products or the C kernel (rollout.engines.hf.native_attention), and in the
shared layout the prompt's part through its C kernel too (rollout.engines.hf.native_prefix: "both kernels").

    python bench/decode_kv_closeness.py --out bench/results/decode_kv_closeness.md

Small random Llama / grouped-query Llama / Qwen2 models (tests/rollout/test_lean_decode.py's), 3 prompts x 8 samples,
40 new tokens sampled at temperature 1; each way scored on its own samples: the mean and largest |decode log-prob -
forward log-prob| over every completion token. decode_attention.LOWER_AT_MOST / LOWER_NATIVE_AT_MOST rest on these.
`--prefix`: the shared layout only, with the two ways of both kernels (their columns "-" in the repeated layout).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "rollout"), str(ROOT / "tests")]

import rlvr.rollout.engines.hf.lean_decode as ld  # noqa: E402
import rlvr.rollout.engines.hf.steps as steps  # noqa: E402
from _report import result_head  # noqa: E402
from rlvr.rollout import SamplingParams  # noqa: E402
from rlvr.rollout.engines.hf.decode_attention import AttentionWay  # noqa: E402
from test_lean_decode import _generate, _model  # noqa: E402

WAYS = {  # name: (buffers' dtype, own slots through the C kernel, the shared prompt's part through its kernel too)
    "fp32 buffers, products": (torch.float32, False, False),
    "fp32 buffers, kernel": (torch.float32, True, False),
    "bf16 buffers, products": (torch.bfloat16, False, False),
    "bf16 buffers, kernel": (torch.bfloat16, True, False),
}
PREFIX_WAYS = {"fp32 buffers, both kernels": (torch.float32, True, True), "bf16 buffers, both kernels": (torch.bfloat16, True, True)}


def distance(model, tok, way: AttentionWay) -> tuple[float, float]:
    ld.decode_attention_way = lambda *a, **kw: way
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gen = _generate(model, tok, SamplingParams(n=8, temperature=1.0, max_new_tokens=40, ignore_eos=True))
        ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)
        mask = torch.cat([gen.prompt_mask, gen.completion_mask], 1)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits.float()
    P = gen.prompt_ids.shape[1]
    forward = logits[:, P - 1 : -1].log_softmax(-1).gather(-1, gen.completion_ids[..., None])[..., 0]
    d = (gen.sampling_logprobs - forward)[gen.completion_mask.bool()].abs()
    return float(d.mean()), float(d.max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--prefix", action="store_true", help="the shared layout, with the prompt part's kernel too")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ways = WAYS | (PREFIX_WAYS if args.prefix else {})
    ratios_named = ["kernel bf16 / fp32 products (means)", "products bf16 / fp32 (means)"]
    ratios_named += ["both kernels bf16 / fp32 products (means)"] if args.prefix else []
    cols = ["model", "layout"] + [f"{w}: mean / max" for w in ways] + ratios_named
    lines = result_head(
        "Decode log-probs against the whole sequence's forward, bf16 autocast",
        "python bench/decode_kv_closeness.py " + " ".join(sys.argv[1:]),
        "each way scored on its own 24 samples of 40 tokens (module docstring).",
        cols,
    )
    for kind in ["llama", "llama-gqa", "qwen2"]:
        for layout in ["shared"] if args.prefix else ["repeated", "shared"]:
            tok, model = _model(kind)
            steps.SHARED_PREFIX_MIN_PROMPT = 10**6 if layout == "repeated" else 0
            shared = layout == "shared"
            got = {name: distance(model, tok, AttentionWay(dt, False, shared, native, both)) for name, (dt, native, both) in ways.items()}
            mean = {name: m for name, (m, _) in got.items()}
            cells = [f"{m:.2e} / {x:.2e}" for m, x in got.values()]
            ratios = [
                mean["bf16 buffers, kernel"] / mean["fp32 buffers, products"],
                mean["bf16 buffers, products"] / mean["fp32 buffers, products"],
            ]
            ratios += [mean["bf16 buffers, both kernels"] / mean["fp32 buffers, products"]] if args.prefix else []
            lines.append("| " + " | ".join([kind, layout, *cells, *(f"{r:.2f}" for r in ratios)]) + " |")
            print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join([*lines, ""]))


if __name__ == "__main__":
    main()
