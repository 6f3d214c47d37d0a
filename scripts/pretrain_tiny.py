"""Pre-train the bundled tiny models (supervised): `tiny` on the built-in arithmetic task, and with
`--recipe tools` `tiny-tools` on the tool-use tasks (see the comment block of that recipe below).

    python scripts/pretrain_tiny.py --out src/rlvr/models/tiny
    python scripts/pretrain_tiny.py --recipe tools --out src/rlvr/models/tiny-tools

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
import hashlib
import random
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rlvr.tasks.arithmetic import eval_problems, is_correct, problems  # noqa: E402
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
    from rlvr.rollout.engines.hf import HFEngine
    from rlvr.rollout import SamplingParams

    engine = HFEngine(model, tok)
    correct = 0
    for i in range(0, len(probs), batch):
        chunk = probs[i : i + batch]
        prompts = [tok.apply_chat_template(p.row()["prompt"], add_generation_prompt=True, tokenize=False) for p in chunk]
        out = engine.generate(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=8), seeds=range(len(prompts)))
        correct += sum(is_correct(c, p.answer) for c, p in zip(out.texts, chunk))
    return correct / len(probs)


# --- --recipe tools: the bundled `tiny-tools` model ------------------------------------------------
#
#     python scripts/pretrain_tiny.py --recipe tools --out src/rlvr/models/tiny-tools
#
# A model that knows the tag protocol of the tool-use tasks (rlvr.tasks.multiplication,
# rlvr.tasks.guess_number) and has the good behaviour in its sampling distribution without
# preferring it, so RL has something to find:
# - multiplication (held-out problems never trained on): with probability --p-call the calculator
#   episode `<calc>a*b</calc><result>p</result>p</s>`, otherwise a direct answer that looks right
#   and never is (the product's leading 1-2 digits, then random digits);
# - guess the number (9 of the 30 targets never the answer: held_back_targets): each guess is the bisection midpoint with
#   probability --p-bisect, anywhere in the range with --p-stray, otherwise uniform inside the
#   interval still consistent with the replies; the replies come from rlvr.tasks.guess_number.
# The loss covers the model's text and its final </s>, never the <result>...</result> spans (the
# tool or the environment writes those during RL too).
# Measured (the committed weights; AMD EPYC, 2 cores, 1473 s): held-out multiplication greedy
# accuracy 0.010 with call rate 0.010; sampled at T=1 (8 per problem, 200 problems) accuracy 0.219,
# call rate 0.242, accuracy given a call 0.904. Guess the number, the 9 held-back targets: greedy success
# 0.444, sampled 0.295. Re-running this command reproduces the committed run's losses and
# evaluations digit for digit (checked through step 600 of 1000 on 2026-12-01).

TOOLS_DEFAULTS = {"out": Path("src/rlvr/models/tiny-tools"), "steps": 1000, "batch": 128, "lr": 3e-3}
EOS_TEXT = "</s>"


def _direct_answer(product: int, rng: random.Random, keep: str, tail: str) -> str:
    """A plausible wrong answer: the product's leading digits right, the rest random digits
    (tail "noise") or zeros (tail "zeros": an estimate; one more in the last kept digit when the
    product itself is that round)."""
    s = str(product)
    k = min(len(s) - 1, int(rng.choice(keep)))
    if tail == "zeros":
        return (s[:k] if s[k:].strip("0") else str(int(s[:k]) + 1)) + "0" * (len(s) - k)
    while True:
        if (t := s[:k] + "".join(rng.choice("0123456789") for _ in range(len(s) - k))) != s:
            return t


def multiplication_episode(p, rng: random.Random, args) -> list[tuple[str, bool]]:
    """[(text, trained)] after the prompt."""
    if rng.random() < args.p_call:
        return call_episode(p)
    return [(_direct_answer(p.answer, rng, args.keep_digits, args.direct_tail) + EOS_TEXT, True)]


def call_episode(p, decision_trained: bool = True) -> list[tuple[str, bool]]:
    """The calculator episode; without `decision_trained` its first token (`<`, the choice to call)
    is not trained, so extra examples teach the call without making it likelier."""
    return [
        ("<", decision_trained),
        (f"calc>{p.expression}</calc>", True),
        (f"<result>{p.answer}</result>", False),
        (f"{p.answer}{EOS_TEXT}", True),
    ]


def guess_episode(target: int, rng: random.Random, args, low: int = 1, high: int = 30, k: int = 5) -> list[tuple[str, bool]]:
    from rlvr.tasks.guess_number import GuessNumber

    env = GuessNumber()
    env.reset(target, low=low, high=high, max_guesses=k)
    lo, hi, segs = low, high, []
    for _ in range(k):
        r = rng.random()
        if r < args.p_bisect:
            g = (lo + hi) // 2
        elif r < args.p_bisect + args.p_stray:
            g = rng.randint(low, high)
        else:
            g = rng.randint(lo, hi)
        reply = env.guess(g)
        segs += [(f"<guess>{g}</guess>", True), (f"<result>{reply}</result>", False)]
        if reply == "correct":
            break
        lo, hi = (max(lo, g + 1), hi) if reply == "higher" else (lo, min(hi, g - 1))
    return segs + [(EOS_TEXT, True)]


class CharCodec:
    """Text <-> ids of the character tokenizer without the tokenizer's per-call cost."""

    def __init__(self, tok):
        self.tok, self.vocab = tok, tok.get_vocab()
        self.chars = {i: t for t, i in self.vocab.items()}

    def ids(self, text: str) -> list[int]:
        out, i = [], 0
        while i < len(text):  # the only multi-character tokens in these texts are </s> and the role tokens
            for special in (EOS_TEXT, "<|user|>", "<|assistant|>"):
                if text.startswith(special, i):
                    out.append(self.vocab[special])
                    i += len(special)
                    break
            else:
                out.append(self.vocab[text[i]])
                i += 1
        return out

    def prompt(self, question: str) -> str:
        return self.tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)


def episode_loss(model, codec: CharCodec, rows: list[tuple[str, list[tuple[str, bool]]]], chunk_tokens: int = 4096):
    """Mean cross-entropy over the trained tokens of prompt+episode rows. Rows are sorted by length
    and run in chunks of about `chunk_tokens` padded tokens, so short answers do not pay for long ones."""
    seqs = []
    for question, segs in rows:
        ids = codec.ids(codec.prompt(question))
        lab = [-100] * len(ids)
        for text, trained in segs:
            t = codec.ids(text)
            ids, lab = ids + t, lab + (t if trained else [-100] * len(t))
        seqs.append((ids, lab))
    seqs.sort(key=lambda s: len(s[0]))
    total, count, i = 0.0, 0, 0
    while i < len(seqs):
        j = i + 1
        while j < len(seqs) and (j + 1 - i) * len(seqs[j][0]) <= chunk_tokens:
            j += 1
        chunk, width = seqs[i:j], len(seqs[j - 1][0])
        ids = torch.full((len(chunk), width), codec.tok.pad_token_id)
        lab = torch.full((len(chunk), width), -100)
        att = torch.zeros((len(chunk), width), dtype=torch.long)
        for k, (s, l) in enumerate(chunk):
            ids[k, : len(s)], lab[k, : len(l)], att[k, : len(s)] = torch.tensor(s), torch.tensor(l), 1
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
        total = total + torch.nn.functional.cross_entropy(logits.flatten(0, 1), lab[:, 1:].flatten(), ignore_index=-100, reduction="sum")
        count += int((lab[:, 1:] != -100).sum())
        i = j
    return total / count


@torch.no_grad()
def play(model, codec: CharCodec, questions: list[str], respond, *, temperature: float, max_new: int, seed: int = 0):
    """A small simulated tool loop: decode all rows together, one token per step; after each model
    token `respond(i, text)` may return external text (a tool result), which is fed token by token
    before the model writes again. Returns (completion texts without </s>, finished flags)."""
    import inspect

    from transformers import DynamicCache

    tok = codec.tok
    ckw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    prompts = [codec.ids(codec.prompt(q)) for q in questions]
    n, width = len(prompts), max(map(len, prompts))
    ids = torch.full((n, width), tok.pad_token_id)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
        logits_to_keep=1,
        **{ckw: cache},
    )
    logits, pos = out.logits[:, -1], mask.sum(-1)
    gen = torch.Generator().manual_seed(seed)
    texts, queues, done = [""] * n, [[] for _ in range(n)], [False] * n
    active = list(range(n))  # rows still in the decode batch, in cache order
    for _ in range(max_new):
        if temperature == 0:
            choice = logits.argmax(-1).tolist()
        else:
            choice = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)[:, 0].tolist()
        step = []
        for k, i in enumerate(active):
            if queues[i]:
                step.append(queues[i].pop(0))
                continue
            step.append(choice[k])
            if choice[k] == tok.eos_token_id:
                done[i] = True
                continue
            texts[i] += codec.chars[choice[k]]
            if (ext := respond(i, texts[i])) is not None:
                texts[i] += ext
                queues[i] = codec.ids(ext)
        keep = [k for k, i in enumerate(active) if not done[i]]
        if not keep:
            break
        token = torch.tensor(step)
        if len(keep) < len(active):
            index = torch.tensor(keep)
            cache.batch_select_indices(index)
            active, token, mask, pos = [active[k] for k in keep], token[index], mask[index], pos[index]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=pos[:, None], use_cache=True, **{ckw: cache})
        logits, pos = out.logits[:, -1], pos + 1
    return texts, done


def _calculator(text: str) -> str | None:
    """The simulated calculator: `<result>a*b</result>` when the text ends with a call."""
    import re

    if not text.endswith("</calc>"):
        return None
    m = re.search(r"<calc>(\d{1,6})\*(\d{1,6})</calc>$", text)
    return f"<result>{int(m.group(1)) * int(m.group(2))}</result>" if m else "<result>error</result>"


def eval_multiplication(model, codec, problems, *, samples: int, seed: int = 0) -> dict:
    from rlvr.tasks.multiplication import final_answer

    rows = [p for p in problems for _ in range(samples)]
    texts, _ = play(
        model,
        codec,
        [p.question for p in rows],
        lambda i, t: _calculator(t),
        temperature=0.0 if samples == 1 else 1.0,
        max_new=64,
        seed=seed,
    )
    ok = final_answer(None, texts, answer=[str(p.answer) for p in rows])
    calls = [t.startswith("<calc>") for t in texts]
    hit = sum(o for o, c in zip(ok, calls) if c)
    return {
        "accuracy": sum(ok) / len(rows),
        "call_rate": sum(calls) / len(rows),
        "accuracy_given_call": hit / max(1, sum(calls)),
        "example": texts[0],
    }


def eval_guess(model, codec, targets: list[int], *, samples: int, seed: int = 0) -> dict:
    import re

    from rlvr.tasks.guess_number import GuessNumber, prompt_text

    rows = [t for t in targets for _ in range(samples)]
    envs = [GuessNumber() for _ in rows]
    for env, t in zip(envs, rows):
        env.reset(t)

    def respond(i, text):
        if not text.endswith("</guess>"):
            return None
        m = re.search(r"<guess>([^<]*)</guess>$", text)
        return f"<result>{envs[i].guess(m.group(1) if m else '')}</result>"

    texts, done = play(
        model, codec, [prompt_text() for _ in rows], respond, temperature=0.0 if samples == 1 else 1.0, max_new=300, seed=seed
    )
    won = [env.get_reward() for env in envs]
    guesses = [t.count("<guess>") for t in texts]
    return {
        "success": sum(won) / len(rows),
        "mean_guesses": sum(guesses) / len(rows),
        "finished": sum(done) / len(rows),
        "example": texts[0],
    }


def held_back_targets(low: int = 1, high: int = 30) -> list[int]:
    """The 9 targets (30 %, by hash) that the pretraining corpus never has as the answer. (The
    `guess_number` task itself trains and evaluates on the whole range: see rlvr.tasks.guess_number.)"""
    digest = lambda t: hashlib.blake2b(f"guess:{low}-{high}:{t}".encode(), digest_size=8).digest()  # noqa: E731
    return sorted(sorted(range(low, high + 1), key=digest)[: round(0.3 * (high - low + 1))])


def pretraining_targets(low: int = 1, high: int = 30) -> list[int]:
    held = set(held_back_targets(low, high))
    return [t for t in range(low, high + 1) if t not in held]


def evaluate_tools(model, codec, mul_eval, *, full: bool) -> None:
    model.eval()
    n_greedy, n_sampled = (500, 200) if full else (200, 50)
    g = eval_multiplication(model, codec, mul_eval[:n_greedy], samples=1)
    s = eval_multiplication(model, codec, mul_eval[:n_sampled], samples=8, seed=1)
    print(
        f"  multiplication held-out: greedy accuracy {g['accuracy']:.3f} call rate {g['call_rate']:.3f} "
        f"accuracy|call {g['accuracy_given_call']:.3f}; sampled (T=1, 8 per problem, {n_sampled} problems) "
        f"accuracy {s['accuracy']:.3f} call rate {s['call_rate']:.3f} accuracy|call {s['accuracy_given_call']:.3f}"
    )
    for name, targets in (("not pretrained", held_back_targets()), ("pretrained", pretraining_targets())):
        gg = eval_guess(model, codec, targets, samples=1)
        gs = eval_guess(model, codec, targets, samples=16 if full else 8, seed=2)
        print(
            f"  guess number {name} targets ({len(targets)}): greedy success {gg['success']:.3f} "
            f"(mean guesses {gg['mean_guesses']:.2f}); sampled success {gs['success']:.3f} (mean guesses "
            f"{gs['mean_guesses']:.2f}, finished {gs['finished']:.3f})"
        )
    print(f"  e.g. {g['example']!r} / {s['example']!r} / {gs['example']!r}", flush=True)
    model.train()


def pretrain_tools(args) -> None:
    from rlvr.tasks import guess_number as gn
    from rlvr.tasks import multiplication as mul

    hidden, inter, layers, heads, max_pos = (int(x) for x in args.size.split(","))
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    tok = build_char_tokenizer()
    tok.model_max_length = max_pos
    codec = CharCodec(tok)
    model = LlamaForCausalLM(
        char_llama_config(tok, hidden_size=hidden, intermediate_size=inter, num_layers=layers, num_heads=heads, max_positions=max_pos)
    )
    print(
        f"parameters: {sum(p.numel() for p in model.parameters()):,}; p_call {args.p_call}, "
        f"keep digits {args.keep_digits} then {args.direct_tail}, "
        f"p_bisect {args.p_bisect}, p_stray {args.p_stray}; per step {args.batch} multiplication rows + {args.extra_calls} "
        f"extra calls, {args.guess_batch} guess-number transcripts"
    )
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.05)
    rng = random.Random(args.seed)
    stream = mul.problems("train", seed=args.seed)
    targets = pretraining_targets()
    mul_eval = mul.eval_problems(500)
    t0, cpu0 = time.time(), time.process_time()
    for step in range(1, args.steps + 1):
        mul_rows = [(p.question, multiplication_episode(p, rng, args)) for p in (next(stream) for _ in range(args.batch))]
        mul_rows += [(p.question, call_episode(p, decision_trained=False)) for p in (next(stream) for _ in range(args.extra_calls))]
        guess_rows = [(gn.prompt_text(), guess_episode(rng.choice(targets), rng, args)) for _ in range(args.guess_batch)]
        loss_m, loss_g = episode_loss(model, codec, mul_rows), episode_loss(model, codec, guess_rows)
        loss = loss_m + loss_g
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0:
            print(f"step {step} loss multiplication {loss_m.item():.4f} guess {loss_g.item():.4f} ({time.time() - t0:.0f}s)", flush=True)
        if step % max(1, args.steps // 4) == 0 and step != args.steps:
            evaluate_tools(model, codec, mul_eval, full=False)
    print(
        f"pretraining took {time.time() - t0:.0f}s ({time.process_time() - cpu0:.0f}s of CPU time, evaluations included); final evaluation:"
    )
    evaluate_tools(model, codec, mul_eval, full=True)
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    print(f"saved to {args.out}")


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
    ap.add_argument(
        "--recipe",
        choices=("default", "tools"),
        default="default",
        help="tools: the bundled tiny-tools model (multiplication with a calculator, guess the number), "
        "with its own defaults for --out/--steps/--batch/--lr (TOOLS_DEFAULTS)",
    )
    ap.add_argument("--p-call", type=float, default=0.25, help="tools: share of multiplication answers that call the calculator")
    ap.add_argument(
        "--keep-digits", default="12", help="tools: a direct answer keeps this many leading digits right (drawn from the string)"
    )
    ap.add_argument(
        "--direct-tail", choices=("noise", "zeros"), default="noise", help="tools: a direct answer's digits after the kept ones"
    )
    ap.add_argument("--p-bisect", type=float, default=0.3, help="tools: share of guesses at the bisection midpoint")
    ap.add_argument(
        "--p-stray", type=float, default=0.1, help="tools: share of guesses anywhere in the range (not the consistent interval)"
    )
    ap.add_argument(
        "--extra-calls", type=int, default=64, help="tools: extra calculator episodes per step whose decision to call is not trained"
    )
    ap.add_argument(
        "--guess-batch", type=int, default=16, help="tools: guess-the-number transcripts per step (--batch: multiplication rows)"
    )
    ap.add_argument("--size", default="128,384,4,4,320", help="tools: hidden,intermediate,layers,heads,max_positions")
    if ap.parse_known_args()[0].recipe == "tools":
        ap.set_defaults(**TOOLS_DEFAULTS)
    args = ap.parse_args()
    if args.recipe == "tools":
        return pretrain_tools(args)

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
