"""The same GRPOConfig through TRL 1.16 and through rlvr.GRPOTrainer computes the same loss on the same completions.

    /path/to/venv-with-trl/bin/python bench/trl_same_config.py --out bench/results/trl_same_config.md   # trl==1.16.0

For each GRPOConfig (loss settings away from the defaults as a script would set them), rlvr.GRPOTrainer trains one
step on the tiny model; its logged `loss` is the loss of that step's completions. The same completions, the same
advantages and the same per-token log-probs (the tiny model before the update, at the config's temperature) then
go through TRL's own GRPOTrainer._compute_loss (the installed code, called unbound on a stand-in `self` whose
settings GRPOTrainer.__init__ would take from a real trl.GRPOConfig built with the same arguments). What this
checks: rlvr's mapping of the GRPOConfig fields and rlvr's loss, against TRL's meaning of them, on a real batch.
At a step's first optimizer step the ratio is 1, so the clip settings do not act here (tests/algo and
bench/trl_loss_oracle.py check them against TRL's code on random ratios); the aggregations, the entropy bonus and
mask, truncation masking and the temperature do (the grpo row is 0 by construction: at ratio 1 its per-sequence
mean is minus the mean advantage, and the KL is 0 at the first step). What it does not check: the forward (TRL's
fused_lm_head log-probs) and TRL's advantage code (rlvr's advantages are checked against a transcription of TRL's
in tests/algo).
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import types
from pathlib import Path

import torch
from _report import cpu_name

CONFIGS = {
    "defaults (dapo)": {},
    "grpo, beta 0.04, clip-higher": dict(loss_type="grpo", beta=0.04, epsilon_high=0.28),
    "dr_grpo, no std scaling": dict(loss_type="dr_grpo", scale_rewards=False),
    "gspo (sequence level)": dict(loss_type="dapo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
    "bnpo, temperature 0.7, masked truncation": dict(loss_type="bnpo", temperature=0.7, mask_truncated_completions=True),
    "cispo": dict(loss_type="cispo", epsilon_high=5.0),
    "sapo": dict(loss_type="sapo"),
    "entropy bonus, top-entropy 0.5": dict(entropy_coef=0.01, top_entropy_quantile=0.5),
}
COMMON = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=12, max_steps=1, bf16=False, seed=3)


def rlvr_step(kwargs: dict, out: Path):
    from datasets import Dataset

    from rlvr import GRPOConfig, GRPOTrainer

    rows = [
        {"prompt": f"{w} {n}"} for w in ("once upon a time", "the cat", "lists:", "why") for n in range(5)
    ]  # off the tiny model's task: varied lengths

    def reward_len(completions, **kw):
        return [-abs(6 - len(c)) for c in completions]

    trainer = GRPOTrainer(
        model="tiny",
        reward_funcs=reward_len,
        args=GRPOConfig(output_dir=str(out), **COMMON, **kwargs),
        train_dataset=Dataset.from_list(rows),
    )
    t = trainer._trainer
    initial = {k: v.clone() for k, v in t.model.state_dict().items()}
    trainer.train()
    loss = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    t.model.load_state_dict(initial)  # the weights the step's completions were sampled from
    return t, t.last_step, loss


def trl_loss(t, record, kwargs: dict) -> float:
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.models.forward import completion_logprobs

    args = GRPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, **COMMON, **kwargs)
    e, adv = record.batch.episodes, record.advantages
    with torch.no_grad():
        lp = completion_logprobs(
            t.model,
            e.prompt_ids,
            e.prompt_mask,
            e.completion_ids,
            e.attention_mask,
            temperature=args.temperature,
            with_entropy=True,
            group_ids=e.group_ids,
        )
    accel = types.SimpleNamespace(
        num_processes=1,
        sync_gradients=True,
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
        pad_across_processes=lambda x, dim=0, pad_index=0: x,
    )
    stub = types.SimpleNamespace(
        args=args,
        aux_loss_enabled=False,
        top_entropy_quantile=args.top_entropy_quantile,
        off_policy_mask_threshold=args.off_policy_mask_threshold,
        importance_sampling_level=args.importance_sampling_level,
        beta=args.beta,
        loss_type=args.loss_type,
        epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=types.SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=accel,
        _entropy_bonus_enabled=args.entropy_coef != 0.0,
        use_adaptive_entropy=False,
        entropy_coef=args.entropy_coef,
        max_completion_length=args.max_completion_length,
        _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask,
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
        get_high_entropy_mask=lambda entropies, mask, threshold: GRPOTrainer.get_high_entropy_mask(stub, entropies, mask, threshold),
        _get_per_token_logps_and_entropies=lambda *a, **k: (lp.logp, lp.entropy, None),
    )
    mask = e.loss_mask.float()
    if args.mask_truncated_completions:
        mask = mask * (~e.truncated).float().unsqueeze(1)  # TRL zeroes truncated rows' completion_mask when it makes the batch
    batch = dict(
        prompt_ids=e.prompt_ids,
        prompt_mask=e.prompt_mask,
        completion_ids=e.completion_ids,
        completion_mask=mask,
        advantages=adv,
        old_per_token_logps=lp.logp,
        ref_per_token_logps=lp.logp,  # the reference is the initial policy: the same log-probs at step 1
        num_items_in_batch=mask.sum(),
    )
    return GRPOTrainer._compute_loss(stub, None, batch).item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import trl

    torch.set_default_dtype(torch.float32)
    lines = [
        "# The same GRPOConfig through TRL 1.16's loss and through rlvr.GRPOTrainer",
        "",
        f"Command: `python bench/trl_same_config.py --out {a.out}` (trl {trl.__version__}, torch {torch.__version__}, "
        f"{cpu_name()}). One step of the tiny model, 8 completions (2 prompts x 4), float32.",
        "",
        "| GRPOConfig | rlvr loss (logged) | TRL _compute_loss | abs diff |",
        "|---|---|---|---|",
    ]
    worst = 0.0
    for name, kwargs in CONFIGS.items():
        with tempfile.TemporaryDirectory() as d:
            t, record, ours = rlvr_step(kwargs, Path(d) / "run")
            theirs = trl_loss(t, record, kwargs)
        worst = max(worst, abs(ours - theirs))
        lines.append(f"| {name}: `{kwargs}` | {ours:.8f} | {theirs:.8f} | {abs(ours - theirs):.1e} |")
        print(lines[-1], flush=True)
    lines += [
        "",
        f"Largest difference: {worst:.1e}. rlvr's loss comes from its training forward (each group's prompt run once, "
        "micro-batches trimmed of padding), TRL's side from one forward over the same batch: float32 rounding between the "
        "two forwards shows where the loss depends on the log-probs themselves (cispo), not only on their ratio.",
    ]
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
