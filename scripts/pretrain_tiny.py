"""Pre-train the bundled tiny model (supervised, on the built-in arithmetic task).

    python scripts/pretrain_tiny.py --out src/rlvr/models/tiny

Reproducible from --seed on CPU. The goal is a *modest* model that leaves room for RL to show:
it must know the format and have the right answer within its sampling distribution, without
preferring it. So the supervised answers are deliberately noisy in one systematic way: with
probability --noise an answer is replaced by the classic schoolchild's mistake, carries (for
+) or borrows (for -) dropped digit by digit. Problems without carries are unaffected, so the
model starts at roughly the share of carry-free problems, and GRPO has to discover that the
exact answer is what the verifier pays for. Held-out problems are never trained on.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rlvr.data.arithmetic import eval_problems, is_correct, problems  # noqa: E402
from rlvr.models.build import char_llama_config  # noqa: E402
from rlvr.models.tokenizer import build_char_tokenizer  # noqa: E402


def digitwise_mistake(a: int, op: str, b: int) -> int:
    """a op b computed digit by digit with carries/borrows dropped (only for + and -)."""
    if op not in "+-":
        return a * b
    out, place = 0, 1
    while a or b:
        da, db = a % 10, b % 10
        d = (da + db) % 10 if op == "+" else abs(da - db)
        out += d * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def encode_batch(tok, rows: list[tuple[str, str]]):
    """Right-padded prompt+answer ids, with labels only on the answer and its EOS."""
    seqs, labels = [], []
    for question, answer in rows:
        p = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
        p_ids = tok(p, add_special_tokens=False)["input_ids"]
        a_ids = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        seqs.append(p_ids + a_ids)
        labels.append([-100] * len(p_ids) + a_ids)
    n = max(map(len, seqs))
    ids = torch.full((len(seqs), n), tok.pad_token_id)
    lab = torch.full((len(seqs), n), -100)
    att = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(l)] = torch.tensor(l)
        att[i, : len(s)] = 1
    return ids, att, lab


@torch.no_grad()
def greedy_accuracy(model, tok, probs, batch=250) -> float:
    from rlvr.rollout.hf import HFEngine
    from rlvr.rollout import SamplingParams

    engine = HFEngine(model, tok)
    correct = 0
    for i in range(0, len(probs), batch):
        chunk = probs[i : i + batch]
        prompts = [tok.apply_chat_template(p.row()["prompt"], add_generation_prompt=True, tokenize=False) for p in chunk]
        out = engine.generate(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=8), seeds=range(len(prompts)))
        correct += sum(is_correct(c, p.answer) for c, p in zip(out.texts, chunk))
    return correct / len(probs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("src/rlvr/models/tiny"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=1, help="torch threads; results are bitwise reproducible for a fixed count")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--noise", type=float, default=0.7)
    ap.add_argument("--digits", type=int, default=2)
    ap.add_argument("--operators", default="+-")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    tok = build_char_tokenizer()
    model = LlamaForCausalLM(char_llama_config(tok))
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.05)
    rng = random.Random(args.seed)
    stream = problems("train", seed=args.seed, digits=args.digits, operators=args.operators)
    held_out = eval_problems(500, digits=args.digits, operators=args.operators)
    t0 = time.time()
    for step in range(1, args.steps + 1):
        rows = []
        for _ in range(args.batch):
            p = next(stream)
            ans = p.answer if rng.random() >= args.noise else digitwise_mistake(p.a, p.op, p.b)
            rows.append((p.question, str(ans)))
        ids, att, lab = encode_batch(tok, rows)
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 250 == 0 or step == args.steps:
            model.eval()
            acc = greedy_accuracy(model, tok, held_out)
            model.train()
            print(f"step {step} loss {loss.item():.4f} held-out greedy accuracy {acc:.3f} ({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
