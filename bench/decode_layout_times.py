"""The lean decode's attention alone in each KV layout and buffer dtype, at a model's head shapes and several prompt
lengths: decode_attention.decode_attention_way's own timing (mid-decode, several layers' buffers read in turn), each
way's seconds per call:

    python bench/decode_layout_times.py 4,16,8,2,40 8,8,8,8,64 --prompts 16,32,64,80,128 --capacity 64

Each shape is groups,group_size,q_heads,kv_heads,head_dim (F's 9M model: 4,16,8,2,40; B/C's 25M: 8,8,8,8,64); 8 layers.
"""

from __future__ import annotations

import argparse

import torch

import rlvr.rollout.engines.hf.decode_attention as da


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="+")
    ap.add_argument("--prompts", default="16,32,64,80,128")
    ap.add_argument("--capacity", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(2)
    print("| shape (B, G, Hq, Hkv, D) | prompt | repeated fp32 / bf16 us | shared fp32 / flash / bf16 us | chosen |")
    print("| --- | --- | --- | --- | --- |")
    for shape in args.shapes:
        B, G, Hq, Hkv, D = (int(x) for x in shape.split(","))
        for P in (int(p) for p in args.prompts.split(",")):
            e = da._time_ways(B, G, Hq, Hkv, D, P, args.capacity, torch.float32, (False, True), torch.bfloat16, 8)
            us = {k: e[k] * 1e6 for k in e if k.endswith("_s")}
            chosen = ("shared" if e["shared"] else "repeated") + (" flash" if e["flash"] else "") + (" bf16" if e["lower"] else " fp32")
            repeated = f"{us['repeated_s']:.0f} / {us['repeated_lower_s']:.0f}"
            shared = f"{us['shared_s']:.0f} / {us['shared_flash_s']:.0f} / {us['shared_lower_s']:.0f}"
            print(f"| {B}, {G}, {Hq}, {Hkv}, {D} | {P} | {repeated} | {shared} | {chosen} |", flush=True)


if __name__ == "__main__":
    main()
