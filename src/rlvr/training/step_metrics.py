"""Per-step metrics of a batch (TRL's names), the completions table rows, and the record of the last step they come from."""

from __future__ import annotations

import time

import math
from dataclasses import dataclass

import torch

from rlvr.training.collect import Batch


@dataclass
class StepRecord:
    """The last step's batch, its advantages and the micro-batches its update ran (this rank)."""

    batch: Batch
    advantages: torch.Tensor  # [N]
    micro_batch_sizes: list[int]


def batch_metrics(batch, advantages: torch.Tensor) -> dict:
    """Reward, group and length statistics of one step's batch (a rlvr.training.collect.Batch).

    The reward statistics describe every episode the step generated: with dynamic sampling, all
    rounds, the dropped groups too (what the policy did, comparable with a run without it); the
    kept groups' (the trained batch's) reward and zero-std share are `sampling/kept_*`. The other
    statistics describe the trained batch."""
    r = batch.episodes
    lengths = r.loss_mask.sum(-1).float()  # the model's own tokens (as TRL counts them with tools)
    generated = batch.rewards if batch.generated_rewards is None else batch.generated_rewards
    m = reward_metrics(generated, batch.reward_weights, batch.reward_names, r.group_size)
    total = (batch.rewards * batch.reward_weights).nansum(-1)  # [N] the trained batch's
    ended = lengths[~r.truncated.bool().to(lengths.device)]  # those that stopped by themselves (EOS, a stop string)
    ended = ended if ended.numel() else torch.zeros(1)  # none: TRL logs 0
    m.update(
        {
            "distinct_completions": distinct_share(r.texts, r.group_size),
            "completions/mean_length": float(lengths.mean()),
            "completions/min_length": float(lengths.min()),
            "completions/max_length": float(lengths.max()),
            "completions/clipped_ratio": float(r.truncated.float().mean()),
            "completions/mean_terminated_length": float(ended.mean()),
            "completions/min_terminated_length": float(ended.min()),
            "completions/max_terminated_length": float(ended.max()),
            **_reward_by_ending(total, r.truncated.bool().to(total.device)),  # rewards on the CPU, episodes on the model's device
            "advantages/abs_mean": float(advantages.abs().mean()),
        }
    )
    if batch.generated_rewards is not None:  # dynamic sampling
        kept = reward_metrics(batch.rewards, batch.reward_weights, batch.reward_names, r.group_size)
        m.update(
            {
                "sampling/rounds": batch.rounds,
                "sampling/prompts_consumed": batch.prompts_consumed,
                "sampling/groups_kept": len(batch.rows),
                "sampling/kept_reward": kept["reward"],
                "sampling/kept_frac_reward_zero_std": kept["frac_reward_zero_std"],
            }
        )
    return m


def reward_metrics(rewards: torch.Tensor, weights: torch.Tensor, names: list[str], group_size: int) -> dict:
    """TRL 1.16's reward statistics of [N, K] rewards (N group-major, NaN: not applicable) with weights [K]: `reward`
    and `reward_std` over the completions some function scored (the std with Bessel's correction, over the whole
    batch; 0 for fewer than two), `rewards/<fn>/mean` and `/std` over the completions that function scored."""
    total = (rewards * weights).nansum(-1)  # [N]
    scored = total[~rewards.isnan().all(-1)]  # a completion no function scored counts nowhere
    m = {"reward": _mean(scored), "reward_std": _std(scored), **identical_groups(total.view(-1, group_size))}
    for k, name in enumerate(names):
        col = rewards[:, k]
        valid = col[~col.isnan()]
        m[f"rewards/{name}/mean"], m[f"rewards/{name}/std"] = _mean(valid), _std(valid)
    return m


def _mean(x: torch.Tensor) -> float:
    return float(x.mean()) if x.numel() else float("nan")


def _std(x: torch.Tensor) -> float:
    return float(x.std()) if x.numel() > 1 else 0.0 if x.numel() else float("nan")


def identical_groups(grouped: torch.Tensor) -> dict:
    """Groups whose rewards are all equal (no signal), and where they sit: at the step's highest total
    reward (`/top`: solved, when the top is a right answer) or its lowest (`/bottom`). The doctor tells
    prompts too easy (identical at the top) from too hard (at the bottom) from a collapsed policy
    (identical at both, because every group repeats one answer, right or wrong)."""
    identical = (grouped.max(-1).values - grouped.min(-1).values) <= 1e-12  # [groups]
    first = grouped[:, 0]  # [groups]
    return {
        "frac_reward_zero_std": float(identical.float().mean()),
        "frac_reward_zero_std/top": float((identical & (first >= grouped.max() - 1e-12)).float().mean()),
        "frac_reward_zero_std/bottom": float((identical & (first <= grouped.min() + 1e-12)).float().mean()),
    }


def distinct_share(texts: list[str], group_size: int) -> float:
    """Mean over groups of (distinct completion texts / group size): 1 when every completion differs,
    1/G when each group repeats one completion (a policy that stopped exploring)."""
    groups = [texts[i : i + group_size] for i in range(0, len(texts), group_size)]
    return sum(len(set(g)) for g in groups) / (len(groups) * group_size)


def _reward_by_ending(total: torch.Tensor, cut: torch.Tensor) -> dict:
    """Mean total reward of the completions cut at max_new_tokens and of those that ended (NaN when
    there are none): when cut ones score lower, the limit is what makes them fail."""
    nan = float("nan")
    return {
        "completions/clipped_reward_mean": float(total[cut].mean()) if cut.any() else nan,
        "completions/terminated_reward_mean": float(total[~cut].mean()) if (~cut).any() else nan,
    }


def completion_rows(batch, advantages: torch.Tensor, step: int, n: int) -> list[dict]:
    """n completions with their prompt, each reward and advantage: the first of every group, then
    the second of every group, ..., so the table covers many prompts rather than one group."""
    N, group_size = len(batch.episodes), batch.episodes.group_size
    order = sorted(range(N), key=lambda i: (i % group_size, i // group_size))
    out = []
    for i in sorted(order[: min(n, N)]):
        out.append(
            {
                "step": step,
                "prompt": batch.rows[i // group_size]["prompt"],
                "completion": batch.episodes.texts[i],
                **_conversation(batch.episodes.completions[i]),
                **{f"reward/{name}": _num(batch.rewards[i, k]) for k, name in enumerate(batch.reward_names)},
                "advantage": float(advantages[i]),
                **_version(batch.episodes, i),
                **{k: v[i] for k, v in batch.episodes.logged.items() if not k.startswith("reward/") and k not in _ROW_KEYS},
            }
        )
    return out


_ROW_KEYS = ("step", "prompt", "completion", "conversation", "advantage", "weight_version")  # a logged column cannot replace these


def _version(episodes, i: int) -> dict:
    """The weight version the episode was sampled under (generation servers), as `weight_version`."""
    return {} if episodes.versions is None else {"weight_version": int(episodes.versions[i])}


def _conversation(completion) -> dict:
    """Multi-turn episodes (more than one message after the prompt) are logged as the conversation too."""
    return {"conversation": completion} if isinstance(completion, list) and len(completion) > 1 else {}


def _num(x: torch.Tensor):
    v = float(x)
    return None if math.isnan(v) else v


def step_times(batch, *, t0: float, t_collect: float, t_train: float) -> dict:
    """Where the step's wall time went: generating (collecting less scoring), scoring, the update, in all (since `t0`)."""
    return {
        "time/generate": t_collect - batch.reward_seconds,
        "time/reward": batch.reward_seconds,
        "time/train": t_train,
        "time/step": time.perf_counter() - t0,
    }


def staleness_metrics(batch, trained_version: int) -> dict[str, float]:
    """How many updates older than the weights they train the batch's episodes were sampled (only when versions are known)."""
    v = batch.episodes.versions
    if v is None or not len(v):
        return {}
    lag = (trained_version - v).float()
    return {"staleness/mean": float(lag.mean()), "staleness/max": float(lag.max()), "rollout/stale_dropped": float(batch.stale_dropped)}


def log_completions(log, cfg, metrics: dict, record: StepRecord, *, stopping: bool) -> None:
    """A note when torch.compile built graphs this step, and the completions table: every logging.completions_every steps,
    and always at the first and last step of the run and at a stop (so a run shorter than the interval still shows some)."""
    step = metrics["step"]
    if metrics.get("time/compile"):
        log.info(
            f"[compile] step {step}: torch.compile built the training forward's graphs for a new length bucket "
            f"in {metrics['time/compile']:.1f} s ({metrics['compile/count']} graphs so far)"
        )
    if metrics.get("time/compile_decode"):
        log.info(
            f"[compile] step {step}: torch.compile built the decode step's graphs (rollout.compile) in "
            f"{metrics['time/compile_decode']:.1f} s, inside time/generate ({metrics['compile/decode_graphs']:.0f} graphs so far)"
        )
    due = step % (cfg.logging.completions_every or 1) == 0 or step in (1, cfg.steps) or stopping
    if cfg.logging.completions_every and due:
        log.samples(completion_rows(record.batch, record.advantages, step, cfg.logging.num_completions))
